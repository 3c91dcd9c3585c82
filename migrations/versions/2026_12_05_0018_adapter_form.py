"""adapters.form: the policy's served-form fields when the adapter's dataset froze, so the
gateway serves an adapter in the form it learned whatever the tenant's policy says later

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05 23:40:00

"""
from alembic import op
import sqlalchemy as sa


revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None


def upgrade():
    op.add_column('adapters', sa.Column('form', sa.JSON(), nullable=False,
                                        server_default='{}'))


def downgrade():
    op.drop_column('adapters', 'form')
