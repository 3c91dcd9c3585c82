"""Sluice control plane: the Flask app factory (console + admin API + Celery binding)."""
from __future__ import annotations

import logging
from decimal import Decimal
from typing import Any, Mapping

from flask import Flask
from flask.json.provider import DefaultJSONProvider
from werkzeug.routing import IntegerConverter

from config import load_config


def create_app(test_config: Mapping[str, Any] | None = None, *, env: str | None = None) -> Flask:
    """Build the console + admin API app. ``test_config`` overrides every other source."""
    # "app" as the import name: root_path is the package folder, as the templates expect
    app = Flask("app", template_folder="../templates", static_folder="../static")
    app.json = JSONProvider(app)
    app.config.from_mapping(load_config(env, overrides=test_config))
    logging.basicConfig(level=app.config["LOG_LEVEL"])
    if logging.getLevelName(str(app.config["LOG_LEVEL"]).upper()) > logging.DEBUG \
            and not app.config.get("VERBOSE"):
        # alembic's INFO lines (a screen of them on every CLI call) only when asked for:
        # SLUICE_VERBOSE=1 or SLUICE_LOG_LEVEL=DEBUG
        logging.getLogger("alembic").setLevel(logging.WARNING)
    _check_database_url(app.config["SQLALCHEMY_DATABASE_URI"])
    register_extensions(app)
    # every <int:...> in a route is a row id: one past the database's INTEGER is not a row
    # (a 404 like any missing one, not a database error)
    app.url_map.converters["int"] = RowIdConverter
    register_blueprints(app)
    register_errorhandlers(app)
    register_commands(app)
    return app


class JSONProvider(DefaultJSONProvider):
    """Flask's JSON, with money in fixed point: its default writes a Decimal with str(),
    which gives "3.2E-7" for a third of a micro-dollar and "0E-10" for a zero sum of
    ledger costs (scale 10), where the page and the CSV show 0.00000032 and 0."""

    @staticmethod
    def default(o: Any) -> Any:
        if isinstance(o, Decimal):
            return f"{o:f}"
        return DefaultJSONProvider.default(o)


class RowIdConverter(IntegerConverter):
    """``int`` in routes: 0 .. 2**31 - 1 (PostgreSQL INTEGER, what the id columns are)."""

    def __init__(self, url_map, *args, **kwargs):
        kwargs.setdefault("max", 2**31 - 1)
        super().__init__(url_map, *args, **kwargs)


def _import_models() -> None:
    # Every model module, so metadata (Alembic autogenerate, create_all) sees all tables.
    from app.adapters import models as _ad  # noqa: F401
    from app.audit import models as _a  # noqa: F401
    from app.auth import models as _u  # noqa: F401
    from app.catalog import models as _c  # noqa: F401
    from app.drills import models as _d  # noqa: F401
    from app.finops import models as _f  # noqa: F401
    from app.ledger import models as _l  # noqa: F401
    from app.policies import models as _p  # noqa: F401
    from app.cascade import models as _r  # noqa: F401
    from app.tenants import models as _t  # noqa: F401
    from app.workflows import models as _w  # noqa: F401


def register_extensions(app: Flask) -> None:
    from pathlib import Path

    from app.extensions import csrf, db, login_manager, migrate
    from app.redis_client import init_redis
    from app.celery_binding import celery_init_app

    uri = app.config["SQLALCHEMY_DATABASE_URI"]
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:///:memory:"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    _import_models()
    db.init_app(app)
    migrate.init_app(app, db, directory=str(Path(app.root_path).parent / "migrations"))
    csrf.init_app(app)
    login_manager.init_app(app)
    login_manager.login_view = "auth.login"
    login_manager.login_message_category = "info"

    @login_manager.user_loader
    def load_user(session_id: str):
        from app.auth.service import user_for_session
        return user_for_session(session_id)

    from app import headers
    headers.init_app(app)
    init_redis(app)
    celery_init_app(app)


def register_blueprints(app: Flask) -> None:
    import importlib

    from app.extensions import csrf

    # One scheme for every area: ``app/<area>/views.py`` has the console pages on ``bp``
    # and, when the area has a JSON admin API, its routes on ``api_bp``, mounted under
    # /api/v1. ``app.console.views`` is the home page; ``app.api.views`` has the API's
    # shared auth and parsing helpers, no routes; ``app.api.openapi`` describes the API.
    for name in ("app.console.views", "app.auth.views", "app.tenants.views",
                 "app.catalog.views", "app.policies.views", "app.workflows.views",
                 "app.audit.views", "app.pools.views", "app.drills.views", "app.finops.views",
                 "app.cascade.views", "app.replica_routing.views", "app.cache.views",
                 "app.adapters.views", "app.ledger.views", "app.api.openapi"):
        module = importlib.import_module(name)
        if hasattr(module, "bp"):
            app.register_blueprint(module.bp)
        if hasattr(module, "api_bp"):
            app.register_blueprint(module.api_bp, url_prefix="/api/v1")
            csrf.exempt(module.api_bp)  # bearer-token API: no cookies, so no CSRF surface


def register_errorhandlers(app: Flask) -> None:
    from app.console.errors import register
    register(app)


def register_commands(app: Flask) -> None:
    import importlib

    from app.commands import sluice_cli
    from app.drills.cli import drill_cli
    app.cli.add_command(sluice_cli)
    app.cli.add_command(drill_cli)
    # Each area's cli module adds its drills to ``drill_cli`` on import and returns its
    # own groups (sim, minify, engine ...) from ``groups()``.
    for name in ("app.cache.cli", "app.replica_routing.cli", "app.minify.cli", "app.engine.cli",
                 "app.cascade.cli", "app.adapters.cli"):
        module = importlib.import_module(name)
        for group in getattr(module, "groups", lambda: [])():
            app.cli.add_command(group)
    for command in app.cli.commands.values():
        _explain_unmigrated(command)


_UNMIGRATED = ("no such table", "does not exist")


def _shown_url(uri: str) -> str:
    from sqlalchemy.engine import make_url
    try:
        return make_url(uri).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - unparsable: show it as given, minus any password
        return uri.split("@")[-1] if "@" in uri else uri


def _database_url_error(message: str):
    """A click error (``Error: ...``, exit 1, no traceback, wherever the CLI meets it);
    a web server starting on the same URL shows the same words."""
    import click

    class DatabaseURLError(click.ClickException):
        pass
    return DatabaseURLError(message)


def _check_database_url(uri: str) -> None:
    """SLUICE_DATABASE_URL that cannot be parsed, names an unknown database or a driver
    that is not installed is refused here, in one line naming the variable."""
    from sqlalchemy.engine import make_url
    try:
        make_url(uri).get_dialect().import_dbapi()
    except Exception as exc:  # noqa: BLE001 - parse error, unknown dialect, missing driver
        raise _database_url_error(
            f"SLUICE_DATABASE_URL {_shown_url(uri)!r} is not usable: {exc}. Use e.g. "
            "postgresql+psycopg://user@host/db or sqlite:///path/to/sluice.db") from None


def _explain_unmigrated(command) -> None:
    """A command run on a database that was never migrated says so, and what to run;
    one on a database it cannot reach says which URL and why; neither prints SQLAlchemy's
    traceback (SLUICE_VERBOSE=1 still shows it)."""
    import click
    import sqlalchemy.exc as sa_exc
    from flask import current_app
    for sub in getattr(command, "commands", {}).values():
        _explain_unmigrated(sub)
    callback = command.callback
    if callback is None or getattr(callback, "_explains_unmigrated", False):
        return

    def wrapped(*args, **kwargs):
        try:
            return callback(*args, **kwargs)
        except (sa_exc.OperationalError, sa_exc.InterfaceError) as exc:
            # no statement: the error came while connecting (host, port, credentials,
            # a database that does not exist), not from a query
            if exc.statement is not None or current_app.config.get("VERBOSE"):
                if not any(m in str(exc.orig).lower() for m in _UNMIGRATED):
                    raise
                raise _unmigrated(exc) from None
            uri = current_app.config["SQLALCHEMY_DATABASE_URI"]
            reason = " ".join(str(exc.orig).split())
            raise click.ClickException(
                f"cannot reach the database at {_shown_url(uri)} ({reason}): check "
                "SLUICE_DATABASE_URL and that the server is running") from None
        except sa_exc.ProgrammingError as exc:
            if not any(m in str(exc.orig).lower() for m in _UNMIGRATED):
                raise
            raise _unmigrated(exc) from None
    wrapped._explains_unmigrated = True
    wrapped.__wrapped__ = callback
    command.callback = wrapped


def _unmigrated(exc):
    import click
    return click.ClickException(
        f"the database has no Sluice tables yet ({str(exc.orig).splitlines()[0]}): "
        "run `flask --app wsgi db upgrade` first")
