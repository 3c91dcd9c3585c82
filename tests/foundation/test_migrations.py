"""Migrations upgrade to head and downgrade to base on the test database server."""
import os
import re
import uuid

import pytest
import sqlalchemy as sa
from flask_migrate import downgrade, upgrade

from tests.conftest import PG_DEFAULT


@pytest.fixture()
def scratch_db(tmp_path):
    base = os.environ.get("SLUICE_TEST_DATABASE_URL", PG_DEFAULT)
    if base == "sqlite":
        yield f"sqlite:///{tmp_path / 'mig.db'}"
        return
    name = f"sluice_mig_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    yield re.sub(r"/[^/]*$", f"/{name}", base)
    with admin.connect() as c:
        c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def test_upgrade_head_then_downgrade_base(scratch_db, app_config):
    from app.factory import create_app
    from app.extensions import db
    app = create_app({**app_config, "SQLALCHEMY_DATABASE_URI": scratch_db}, env="test")
    with app.app_context():
        upgrade()
        tables = set(sa.inspect(db.engine).get_table_names())
        model_tables = set(db.metadata.tables)
        assert model_tables <= tables, model_tables - tables
        downgrade(revision="base")
        left = set(sa.inspect(db.engine).get_table_names()) - {"alembic_version"}
        assert left == set()
        db.engine.dispose()


def test_models_match_migrations(scratch_db, app_config):
    """Autogenerate against a migrated database finds nothing to add: every model change
    has its migration."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from app.factory import create_app
    from app.extensions import db
    app = create_app({**app_config, "SQLALCHEMY_DATABASE_URI": scratch_db}, env="test")
    with app.app_context():
        upgrade()
        with db.engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), db.metadata)
        # Type-only differences (UTCDateTime vs DateTime(timezone=True)) are the same column.
        structural = [d for d in diff if not (isinstance(d, list) and d and d[0][0] == "modify_type")]
        assert structural == []
        downgrade(revision="base")
        db.engine.dispose()
