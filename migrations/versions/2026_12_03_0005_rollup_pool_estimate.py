"""ledger_rollups.pool_estimate_usd: the per-token estimate the GPU-hour allocation replaced

Self-hosted pool requests are booked at their tier's per-token price (a real-time
estimate for budgets); when the rollups allocate the pool's GPU-hours to them, the
estimate is recorded here and reports charge gpu_cost_usd instead of it.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03 09:00:00

"""
from alembic import op
import sqlalchemy as sa


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('ledger_rollups', schema=None) as batch_op:
        batch_op.add_column(sa.Column('pool_estimate_usd', sa.Numeric(precision=18, scale=10),
                                      nullable=False, server_default='0'))


def downgrade():
    with op.batch_alter_table('ledger_rollups', schema=None) as batch_op:
        batch_op.drop_column('pool_estimate_usd')
