"""Test fixtures: a fresh PostgreSQL database and Redis namespace per test session.

Set SLUICE_TEST_DATABASE_URL to a server URL (default: the local PostgreSQL at
127.0.0.1:5432) or to ``sqlite`` to run on SQLite instead.
"""
from __future__ import annotations

import json
import os
import re
import uuid

import pytest
import sqlalchemy as sa

from tests.servers import FRONTIER_KEY, Server

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

RUN_ID = uuid.uuid4().hex[:10]
PG_DEFAULT = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
REDIS_URL = os.environ.get("SLUICE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def _make_database(tmp_path_factory) -> tuple[str, callable]:
    base = os.environ.get("SLUICE_TEST_DATABASE_URL", PG_DEFAULT)
    if base == "sqlite":
        path = tmp_path_factory.mktemp("db") / "sluice.db"
        return f"sqlite:///{path}", lambda: None
    name = f"sluice_test_{RUN_ID}"
    admin = sa.create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = re.sub(r"/[^/]*$", f"/{name}", base)

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    return url, drop


def pytest_collection_modifyitems(config, items):
    """Files with a test that loads a real model (``slow``: trainings, engines on SmolLM2,
    browsers over the whole flywheel) go first, each file's tests in their order, so that
    on scripts/test.sh's two processes (``--no-loadscope-reorder``) they do not all start
    last. Measured on this 2-core box it did not shorten the run (18:17 against 17:10
    without it, within run-to-run spread): the trainings still overlap, now at the start."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)


@pytest.fixture(scope="session")
def database_url(tmp_path_factory):
    url, drop = _make_database(tmp_path_factory)
    yield url
    drop()


@pytest.fixture(scope="session")
def redis_namespace():
    ns = f"sluicetest{RUN_ID}"
    yield ns
    import redis
    r = redis.Redis.from_url(REDIS_URL)
    for key in r.scan_iter(f"{ns}:*", count=1000):
        r.delete(key)


@pytest.fixture(scope="session")
def app_config(database_url, redis_namespace, tmp_path_factory):
    return {
        "SQLALCHEMY_DATABASE_URI": database_url,
        "REDIS_URL": REDIS_URL,
        "REDIS_NAMESPACE": redis_namespace,
        "QDRANT_PATH": str(tmp_path_factory.mktemp("qdrant")),
        # the session's own: two sessions side by side (scripts/test.sh runs two) must not
        # clean each other's datasets or read each other's engine pid files
        "ADAPTERS_DIR": str(tmp_path_factory.mktemp("adapters")),
        "POOLS_VAR_DIR": str(tmp_path_factory.mktemp("pools-var")),
        "SECRET_KEY": "test-secret-key-for-sessions",
        # the tests' own webhook receivers listen on the loopback address
        "WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",
        "SERVER_NAME": "localhost",
    }


@pytest.fixture(scope="session")
def _app(app_config):
    from app.factory import create_app
    from app.extensions import db
    app = create_app(app_config, env="test")
    with app.app_context():
        db.create_all()
    yield app
    with app.app_context():
        db.session.remove()
        db.engine.dispose()


@pytest.fixture()
def app(_app):
    """The app inside an app context; every table is emptied after the test."""
    from app.extensions import db
    # Another create_app() (e.g. the migration tests' scratch app) makes its Celery app the
    # default one that shared tasks bind to; take it back for every test.
    _app.extensions["celery"].set_default()
    _app.extensions["celery"].set_current()
    ctx = _app.app_context()
    ctx.push()
    yield _app
    db.session.remove()
    with db.engine.begin() as conn:
        for table in reversed(db.metadata.sorted_tables):
            conn.execute(table.delete())
    ctx.pop()


@pytest.fixture()
def client(app):
    """A browser-like client: each request starts without the previous request's ``g``
    (the ``app`` fixture keeps one app context pushed, which Flask would reuse)."""
    from tests.console.web import browser
    return browser(app)


@pytest.fixture()
def runner(app):
    return app.test_cli_runner()


@pytest.fixture()
def redis_client(app):
    from app.redis_client import get_redis
    return get_redis()


@pytest.fixture(scope="session")
def celery_worker(app_config, tmp_path_factory):
    """A real Celery worker (``--pool solo``, queue ``default``), one per session, shared by
    every test that needs it."""
    from tests.celery_workers import start_worker
    with start_worker(app_config, tmp_path_factory.mktemp("celery"), queue="default",
                      name="sluicetest") as worker:
        yield worker


# Real server processes shared by every test directory (one definition each, so a session
# runs one gateway, one frontier and one pair of fake replicas; a fixture imported into
# another conftest would be a second definition, with processes of its own).
@pytest.fixture(scope="session")
def fake_replicas(tmp_path_factory):
    logs = tmp_path_factory.mktemp("logs")
    servers = [Server("fake", f"r{i}", log_dir=logs) for i in range(2)]
    yield servers
    for s in servers:
        s.stop()


@pytest.fixture(scope="session")
def frontier(tmp_path_factory):
    s = Server("fake", "frontier", log_dir=tmp_path_factory.mktemp("logs"))
    yield s
    s.stop()


@pytest.fixture(scope="session")
def gateway(app_config, tmp_path_factory):
    cfg = {"REDIS_URL": app_config["REDIS_URL"], "REDIS_NAMESPACE": app_config["REDIS_NAMESPACE"],
           "GATEWAY_SNAPSHOT_POLL_S": 0.1, "GATEWAY_MAX_BODY_BYTES": 64 * 1024,
           "QDRANT_PATH": str(tmp_path_factory.mktemp("gateway-qdrant")),
           "GATEWAY_LEDGER_SPOOL_DIR": str(tmp_path_factory.mktemp("gateway-spool"))}
    s = Server("gateway", json.dumps(cfg), env={"SLUICE_PROVIDER_KEY_FRONTIER": FRONTIER_KEY},
               log_dir=tmp_path_factory.mktemp("logs"))
    yield s
    s.stop()

