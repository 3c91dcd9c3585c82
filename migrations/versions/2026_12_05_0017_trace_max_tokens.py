"""adapter_traces.max_tokens: the client's output cap, so the offline evaluation gives an
adapter no more tokens than the live path does

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05 09:30:00

"""
from alembic import op
import sqlalchemy as sa


revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade():
    op.add_column('adapter_traces', sa.Column('max_tokens', sa.Integer(), nullable=True))


def downgrade():
    op.drop_column('adapter_traces', 'max_tokens')
