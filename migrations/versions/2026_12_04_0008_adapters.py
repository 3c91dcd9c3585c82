"""adapters, adapter_events, adapter_traces, adapter_datasets: LoRA rollouts

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04 02:00:00

"""
from alembic import op
import sqlalchemy as sa


revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        'adapter_traces',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('request_id', sa.String(length=64), nullable=False),
        sa.Column('tenant_id', sa.Integer(), nullable=False),
        sa.Column('workflow', sa.String(length=64), nullable=False),
        sa.Column('at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('tier', sa.String(length=64), nullable=False),
        sa.Column('messages', sa.JSON(), nullable=False),
        sa.Column('response_format', sa.JSON(), nullable=True),
        sa.Column('answer', sa.Text(), nullable=False),
        sa.Column('verdict', sa.String(length=8), nullable=True),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_adapter_traces')),
        sa.UniqueConstraint('request_id', name=op.f('uq_adapter_traces_request_id')))
    with op.batch_alter_table('adapter_traces', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_adapter_traces_tenant_id'), ['tenant_id'])
        batch_op.create_index(batch_op.f('ix_adapter_traces_workflow'), ['workflow'])
        batch_op.create_index(batch_op.f('ix_adapter_traces_at'), ['at'])
    op.create_table(
        'adapter_datasets',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('tenant_id', sa.Integer(), nullable=False),
        sa.Column('workflow', sa.String(length=64), nullable=False),
        sa.Column('sha256', sa.String(length=64), nullable=False),
        sa.Column('path', sa.String(length=500), nullable=False),
        sa.Column('n_train', sa.Integer(), nullable=False),
        sa.Column('n_heldout', sa.Integer(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('created_by', sa.String(length=255), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_adapter_datasets')),
        sa.UniqueConstraint('sha256', name=op.f('uq_adapter_datasets_sha256')))
    with op.batch_alter_table('adapter_datasets', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_adapter_datasets_tenant_id'), ['tenant_id'])
    op.create_table(
        'adapters',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('tenant_id', sa.Integer(), nullable=False),
        sa.Column('workflow', sa.String(length=64), nullable=False),
        sa.Column('workflow_name', sa.String(length=200), nullable=False),
        sa.Column('pool_id', sa.Integer(), nullable=True),
        sa.Column('name', sa.String(length=64), nullable=False),
        sa.Column('base_model', sa.String(length=200), nullable=False),
        sa.Column('state', sa.String(length=24), nullable=False),
        sa.Column('requested_by_id', sa.Integer(), nullable=True),
        sa.Column('requested_by', sa.String(length=255), nullable=False),
        sa.Column('approved_by', sa.String(length=255), nullable=True),
        sa.Column('dataset_id', sa.Integer(), nullable=True),
        sa.Column('sha256', sa.String(length=64), nullable=True),
        sa.Column('artifact_path', sa.String(length=500), nullable=True),
        sa.Column('manifest', sa.JSON(), nullable=False),
        sa.Column('hyperparams', sa.JSON(), nullable=False),
        sa.Column('progress', sa.JSON(), nullable=False),
        sa.Column('offline', sa.JSON(), nullable=False),
        sa.Column('shadow', sa.JSON(), nullable=False),
        sa.Column('canary_pct', sa.Integer(), nullable=False),
        sa.Column('previous_adapter_id', sa.Integer(), nullable=True),
        sa.Column('loaded', sa.JSON(), nullable=False),
        sa.Column('error', sa.Text(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(['pool_id'], ['pools.id'], name=op.f('fk_adapters_pool_id_pools'),
                                ondelete='SET NULL'),
        sa.ForeignKeyConstraint(['dataset_id'], ['adapter_datasets.id'],
                                name=op.f('fk_adapters_dataset_id_adapter_datasets'),
                                ondelete='SET NULL'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_adapters')),
        sa.UniqueConstraint('name', name=op.f('uq_adapters_name')))
    with op.batch_alter_table('adapters', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_adapters_tenant_id'), ['tenant_id'])
        batch_op.create_index(batch_op.f('ix_adapters_workflow'), ['workflow'])
        batch_op.create_index(batch_op.f('ix_adapters_state'), ['state'])
    op.create_table(
        'adapter_events',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('adapter_id', sa.Integer(), nullable=False),
        sa.Column('at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('actor_email', sa.String(length=255), nullable=False),
        sa.Column('event', sa.String(length=24), nullable=False),
        sa.Column('from_state', sa.String(length=24), nullable=False),
        sa.Column('to_state', sa.String(length=24), nullable=False),
        sa.Column('comment', sa.Text(), nullable=False),
        sa.Column('data', sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(['adapter_id'], ['adapters.id'],
                                name=op.f('fk_adapter_events_adapter_id_adapters'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_adapter_events')))
    with op.batch_alter_table('adapter_events', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_adapter_events_adapter_id'), ['adapter_id'])


def downgrade():
    op.drop_table('adapter_events')
    op.drop_table('adapters')
    op.drop_table('adapter_datasets')
    op.drop_table('adapter_traces')
