"""robustness: reserved for issue 21 (dead letters, leases); a no-op until that work fills it in

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04 09:00:00

"""
from alembic import op  # noqa: F401
import sqlalchemy as sa  # noqa: F401


revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade():
    pass


def downgrade():
    pass
