"""tool_tokens: tool-definition tokens per ledger row

Three counts on ``ledger_entries``: ``tool_tokens`` (the tool definitions' tokens sent
upstream, in the tier's tokenizer), ``tool_tokens_saved`` (the definitions tool retrieval
kept out of the prompt) and ``tool_retries`` (1 when the model called a tool that was not
sent and the request went again with every tool). Rows booked before this migration
keep 0.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04 09:00:00

"""
from alembic import op
import sqlalchemy as sa


revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None

COLUMNS = ('tool_tokens', 'tool_tokens_saved', 'tool_retries')


def upgrade():
    with op.batch_alter_table('ledger_entries', schema=None) as batch_op:
        for name in COLUMNS:
            batch_op.add_column(sa.Column(name, sa.Integer(), nullable=False,
                                          server_default='0'))


def downgrade():
    with op.batch_alter_table('ledger_entries', schema=None) as batch_op:
        for name in reversed(COLUMNS):
            batch_op.drop_column(name)
