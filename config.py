"""Sluice configuration.

Config classes hold defaults; ``load_config`` reads ``SLUICE_*`` environment
variables when it is called (never at import time) so tests can build any
configuration without patching the environment first.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

ROOT = Path(__file__).resolve().parent
VAR = ROOT / "var"

# Environment variable -> config key, with a converter.
_ENV_KEYS: dict[str, tuple[str, Any]] = {
    "SLUICE_DATABASE_URL": ("SQLALCHEMY_DATABASE_URI", str),
    "SLUICE_REDIS_URL": ("REDIS_URL", str),
    "SLUICE_REDIS_NAMESPACE": ("REDIS_NAMESPACE", str),
    "SLUICE_QDRANT_URL": ("QDRANT_URL", str),
    "SLUICE_QDRANT_PATH": ("QDRANT_PATH", str),
    "SLUICE_SECRET_KEY": ("SECRET_KEY", str),
    "SLUICE_GATEWAY_MAX_BODY_BYTES": ("GATEWAY_MAX_BODY_BYTES", int),
    "SLUICE_GATEWAY_URL": ("GATEWAY_URL", str),
    "SLUICE_GATEWAY_SNAPSHOT_POLL_S": ("GATEWAY_SNAPSHOT_POLL_S", float),
    "SLUICE_GATEWAY_EJECT_S": ("GATEWAY_EJECT_S", float),
    "SLUICE_GATEWAY_LEDGER_SPOOL_DIR": ("GATEWAY_LEDGER_SPOOL_DIR", str),
    "SLUICE_GATEWAY_LEDGER_LINGER_S": ("GATEWAY_LEDGER_LINGER_S", float),
    "SLUICE_GATEWAY_CACHE_WARM": ("GATEWAY_CACHE_WARM", lambda v: v.lower() in {"1", "true", "yes", "on"}),
    "SLUICE_EMBEDDING_BACKEND": ("EMBEDDING_BACKEND", str),
    "SLUICE_EMBEDDING_THREADS": ("EMBEDDING_THREADS", int),
    "SLUICE_EMBEDDING_CACHE_DIR": ("EMBEDDING_CACHE_DIR", str),
    "SLUICE_ENGINE_MODEL": ("ENGINE_MODEL", str),
    "SLUICE_NODE": ("NODE_NAME", str),
    "SLUICE_BUDGET_WEBHOOK_URL": ("BUDGET_WEBHOOK_URL", str),
}

INSECURE_KEYS = {"", "dev", "dev-insecure-key", "change-me", "test"}


class Config:
    ENV_NAME = "base"
    SECRET_KEY = "dev-insecure-key"
    SQLALCHEMY_DATABASE_URI = f"sqlite:///{VAR / 'sluice.db'}"
    SQLALCHEMY_TRACK_MODIFICATIONS = False
    SQLALCHEMY_ENGINE_OPTIONS: dict[str, Any] = {"pool_pre_ping": True}
    REDIS_URL = "redis://127.0.0.1:6379/0"
    # Every key Sluice writes to Redis starts with this, so several deployments
    # (or parallel test runs) can share one server.
    REDIS_NAMESPACE = "sluice"
    QDRANT_URL = ""  # empty: embedded local mode under QDRANT_PATH
    QDRANT_PATH = str(VAR / "qdrant")
    WTF_CSRF_ENABLED = True
    WTF_CSRF_TIME_LIMIT = None
    SESSION_COOKIE_HTTPONLY = True
    SESSION_COOKIE_SAMESITE = "Lax"
    GATEWAY_MAX_BODY_BYTES = 4 * 1024 * 1024
    GATEWAY_URL = "http://127.0.0.1:8400"
    GATEWAY_SNAPSHOT_POLL_S = 0.5   # how often a gateway checks the snapshot version
    GATEWAY_EJECT_S = 5.0           # a replica that failed is skipped this long
    GATEWAY_CACHE_WARM = False      # load the embedding model (and xgrammar) at gateway start
    # Ledger events are spooled here before the answer's last byte, so a killed gateway
    # loses none (the next one on the host sends them on). Empty: memory only.
    GATEWAY_LEDGER_SPOOL_DIR = str(VAR / "spool")
    GATEWAY_LEDGER_LINGER_S = 0.02  # batch ledger events this long before writing them
    # Request embeddings (app.contract.cache.embedding): "auto" runs MiniLM exported to ONNX, cached
    # under EMBEDDING_CACHE_DIR (empty: $XDG_CACHE_HOME/sluice/embedding), and falls back to
    # sentence-transformers; "onnx" (no fallback), "torch", "sentence-transformers".
    EMBEDDING_BACKEND = "auto"
    EMBEDDING_THREADS = 1           # onnxruntime intra-op threads per process
    EMBEDDING_CACHE_DIR = ""
    ENGINE_MODEL = "smollm2"
    NODE_NAME = "local"
    BUDGET_WEBHOOK_URL = ""
    LEDGER_BATCH_SIZE = 500
    CELERY: dict[str, Any] = {}
    TESTING = False

    def celery_settings(self) -> dict[str, Any]:
        return {}


class DevConfig(Config):
    ENV_NAME = "dev"


class TestConfig(Config):
    ENV_NAME = "test"
    TESTING = True
    WTF_CSRF_ENABLED = True  # tests prove CSRF; they fetch tokens like a browser
    SQLALCHEMY_DATABASE_URI = "sqlite://"


class ProdConfig(Config):
    ENV_NAME = "prod"
    SESSION_COOKIE_SECURE = True
    SECRET_KEY = ""


CONFIGS = {"dev": DevConfig, "test": TestConfig, "prod": ProdConfig, "base": Config}


class ConfigError(RuntimeError):
    pass


def load_config(name: str | None = None, environ: Mapping[str, str] | None = None,
                overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Build the effective config dict: class defaults < environment < overrides.

    Raises ConfigError when the production config lacks a real secret key.
    """
    env = os.environ if environ is None else environ
    name = name or env.get("SLUICE_ENV", "dev")
    if name not in CONFIGS:
        raise ConfigError(f"unknown SLUICE_ENV {name!r}; use one of {sorted(CONFIGS)}")
    cls = CONFIGS[name]
    cfg = {k: getattr(cls, k) for k in dir(cls) if k.isupper()}
    for var, (key, conv) in _ENV_KEYS.items():
        if var in env and env[var] != "":
            try:
                cfg[key] = conv(env[var])
            except ValueError as exc:
                raise ConfigError(f"{var}: {exc}") from exc
    if overrides:
        cfg.update(overrides)
    if name == "prod" and (cfg.get("SECRET_KEY") or "") in INSECURE_KEYS | {""}:
        raise ConfigError("SLUICE_SECRET_KEY must be set to a real secret in production")
    if name == "prod" and len(cfg["SECRET_KEY"]) < 16:
        raise ConfigError("SLUICE_SECRET_KEY must be at least 16 characters in production")
    return cfg
