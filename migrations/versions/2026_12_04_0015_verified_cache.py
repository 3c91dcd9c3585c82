"""verified_cache: reserved for issue 22 (verified semantic cache); a no-op until that work fills it in

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-04 09:00:00

"""
from alembic import op  # noqa: F401
import sqlalchemy as sa  # noqa: F401


revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade():
    pass


def downgrade():
    pass
