"""tool_tokens: reserved for issue 23 (tool-definition tokens in the ledger); a no-op until that work fills it in

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04 09:00:00

"""
from alembic import op  # noqa: F401
import sqlalchemy as sa  # noqa: F401


revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade():
    pass


def downgrade():
    pass
