"""ledger_stage_savings: what each pipeline stage saved, per ledger row and per rollup

Five money columns on ``ledger_entries`` and ``ledger_rollups`` (cache, routing,
minification, prefix reuse, margin escalations as a cost): on a gateway row they add up to
``baseline_cost_usd - cost_usd`` (app.core.pricing.stage_savings). Rows booked before this
migration keep 0 in every stage (their saving shows as unattributed in FinOps).
Also issue 24: ``tiers.margin_gamma``, S04's γ calibrated for the tier's model (NULL: the
policy's ``margin_gamma``).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04 09:00:00

"""
from alembic import op
import sqlalchemy as sa


revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None

COLUMNS = ('saved_cache_usd', 'saved_routing_usd', 'saved_minify_usd', 'saved_prefix_usd',
           'saved_escalation_usd')
TABLES = ('ledger_entries', 'ledger_rollups')


def upgrade():
    # S04's γ calibrated per tier (app.cascade.gamma): NULL = the policy's margin_gamma
    with op.batch_alter_table('tiers', schema=None) as batch_op:
        batch_op.add_column(sa.Column('margin_gamma', sa.Float(), nullable=True))
    for table in TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            for name in COLUMNS:
                batch_op.add_column(sa.Column(name, sa.Numeric(precision=18, scale=10),
                                              nullable=False, server_default='0'))


def downgrade():
    for table in TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            for name in reversed(COLUMNS):
                batch_op.drop_column(name)
    with op.batch_alter_table('tiers', schema=None) as batch_op:
        batch_op.drop_column('margin_gamma')
