"""ledger_rollups: TTFT histogram, cache savings and adjustment columns

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02 18:00:00

"""
from alembic import op
import sqlalchemy as sa


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None

# One count column per TTFT histogram bucket (app/finops/histogram.py TTFT_BOUNDS + 1).
TTFT_BUCKETS = [f'ttft_b{i:02d}' for i in range(35)]


def upgrade():
    with op.batch_alter_table('ledger_rollups', schema=None) as batch_op:
        for name in TTFT_BUCKETS:
            batch_op.add_column(sa.Column(name, sa.Integer(), nullable=False,
                                          server_default='0'))
        batch_op.add_column(sa.Column('cache_saved_usd', sa.Numeric(precision=18, scale=10),
                                      nullable=False, server_default='0'))
        batch_op.add_column(sa.Column('adjustment_usd', sa.Numeric(precision=18, scale=10),
                                      nullable=False, server_default='0'))


def downgrade():
    with op.batch_alter_table('ledger_rollups', schema=None) as batch_op:
        batch_op.drop_column('adjustment_usd')
        batch_op.drop_column('cache_saved_usd')
        for name in reversed(TTFT_BUCKETS):
            batch_op.drop_column(name)
