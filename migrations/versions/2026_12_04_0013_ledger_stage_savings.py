"""ledger_stage_savings: reserved for issue 24 (per-stage savings in the ledger); a no-op until that work fills it in

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04 09:00:00

"""
from alembic import op  # noqa: F401
import sqlalchemy as sa  # noqa: F401


revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade():
    pass


def downgrade():
    pass
