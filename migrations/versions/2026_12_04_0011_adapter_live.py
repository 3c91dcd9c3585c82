"""adapters.live: what the canary watcher saw of a serving adapter's live traffic

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04 06:30:00

"""
from alembic import op
import sqlalchemy as sa


revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('adapters', schema=None) as batch_op:
        batch_op.add_column(sa.Column('live', sa.JSON(), nullable=False, server_default='{}'))


def downgrade():
    with op.batch_alter_table('adapters', schema=None) as batch_op:
        batch_op.drop_column('live')
