"""adjustment_requests: ledger adjustments above the two-person threshold wait for a second
FinOps user's approval

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04 06:20:00

"""
from alembic import op
import sqlalchemy as sa


revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        'adjustment_requests',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('tenant_id', sa.Integer(), nullable=False),
        sa.Column('amount_usd', sa.Numeric(18, 10), nullable=False),
        sa.Column('reason', sa.Text(), nullable=False),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('requested_by_id', sa.Integer(), nullable=True),
        sa.Column('requested_by', sa.String(length=255), nullable=False),
        sa.Column('requested_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('decided_by', sa.String(length=255), nullable=True),
        sa.Column('decided_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('decision_comment', sa.Text(), nullable=False, server_default=''),
        sa.Column('ledger_request_id', sa.String(length=64), nullable=True),
        sa.PrimaryKeyConstraint('id'))
    with op.batch_alter_table('adjustment_requests', schema=None) as batch_op:
        batch_op.create_index('ix_adjustment_requests_state', ['state'], unique=False)


def downgrade():
    with op.batch_alter_table('adjustment_requests', schema=None) as batch_op:
        batch_op.drop_index('ix_adjustment_requests_state')
    op.drop_table('adjustment_requests')
