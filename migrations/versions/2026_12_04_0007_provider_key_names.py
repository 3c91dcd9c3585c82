"""tiers.api_key_env: provider keys live in the SLUICE_PROVIDER_KEY_* namespace

The gateway reads only variables named SLUICE_PROVIDER_KEY_<NAME> as upstream keys
(app.contract.secrets). Existing names move into the namespace, without a SLUICE_ prefix
or an _API_KEY suffix (SLUICE_FRONTIER_API_KEY -> SLUICE_PROVIDER_KEY_FRONTIER); the
operator exports the key under its new name (shown in the console's tier list). The downgrade cannot know the old names and keeps the new ones.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04 01:30:00

"""
import re

from alembic import op
import sqlalchemy as sa


revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

PREFIX = "SLUICE_PROVIDER_KEY_"
tiers = sa.table("tiers", sa.column("id", sa.Integer), sa.column("api_key_env", sa.String))


def upgrade():
    conn = op.get_bind()
    for tier_id, name in conn.execute(sa.select(tiers.c.id, tiers.c.api_key_env)).all():
        if not name or name.startswith(PREFIX):
            continue
        base = re.sub(r"[^A-Z0-9_]", "_", name.upper().removeprefix("SLUICE_")
                      .removesuffix("_API_KEY")).strip("_")
        new = (PREFIX + (base or "KEY"))[:100]
        conn.execute(tiers.update().where(tiers.c.id == tier_id).values(api_key_env=new))


def downgrade():
    pass
