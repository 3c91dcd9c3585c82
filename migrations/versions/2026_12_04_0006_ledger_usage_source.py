"""ledger_entries.usage_source: whether the tokens are the engine's or the gateway's count

A stream that ends before the engine's usage chunk (the client hung up, the upstream
broke off) is booked at the tokens the gateway relayed, counted with the tier's
tokenizer: usage_source = 'counted'. A partial index finds those few rows.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04 01:00:00

"""
from alembic import op
import sqlalchemy as sa


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('ledger_entries', schema=None) as batch_op:
        batch_op.add_column(sa.Column('usage_source', sa.String(length=16), nullable=False,
                                      server_default='upstream'))
    op.create_index('ix_ledger_counted_at', 'ledger_entries', ['at'],
                    postgresql_where=sa.text("usage_source = 'counted'"),
                    sqlite_where=sa.text("usage_source = 'counted'"))


def downgrade():
    op.drop_index('ix_ledger_counted_at', table_name='ledger_entries')
    with op.batch_alter_table('ledger_entries', schema=None) as batch_op:
        batch_op.drop_column('usage_source')
