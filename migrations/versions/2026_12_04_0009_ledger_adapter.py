"""ledger_entries.adapter: the LoRA adapter that generated the answer ("" for the base
model), and a partial index on the shadow rows (kind = 'shadow') per adapter, which the
shadow gate counts

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04 12:00:00

"""
from alembic import op
import sqlalchemy as sa


revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('ledger_entries', schema=None) as batch_op:
        batch_op.add_column(sa.Column('adapter', sa.String(length=64), nullable=False,
                                      server_default=''))
    op.create_index('ix_ledger_shadow_adapter', 'ledger_entries', ['adapter'],
                    postgresql_where=sa.text("kind = 'shadow'"),
                    sqlite_where=sa.text("kind = 'shadow'"))


def downgrade():
    op.drop_index('ix_ledger_shadow_adapter', table_name='ledger_entries')
    with op.batch_alter_table('ledger_entries', schema=None) as batch_op:
        batch_op.drop_column('adapter')
