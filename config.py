"""Sluice configuration.

Config classes hold defaults; ``load_config`` reads ``SLUICE_*`` environment
variables when it is called (never at import time) so tests can build any
configuration without patching the environment first.
"""
from __future__ import annotations

import os
import secrets
import time
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
    "SLUICE_INSTANCE_DIR": ("INSTANCE_DIR", str),
    "SLUICE_GATEWAY_MAX_BODY_BYTES": ("GATEWAY_MAX_BODY_BYTES", int),
    "SLUICE_GATEWAY_URL": ("GATEWAY_URL", str),
    "SLUICE_GATEWAY_SNAPSHOT_POLL_S": ("GATEWAY_SNAPSHOT_POLL_S", float),
    "SLUICE_GATEWAY_EJECT_S": ("GATEWAY_EJECT_S", float),
    "SLUICE_GATEWAY_LEDGER_SPOOL_DIR": ("GATEWAY_LEDGER_SPOOL_DIR", str),
    "SLUICE_GATEWAY_LEDGER_LINGER_S": ("GATEWAY_LEDGER_LINGER_S", float),
    "SLUICE_GATEWAY_LEDGER_MAX_BACKLOG": ("GATEWAY_LEDGER_MAX_BACKLOG", int),
    "SLUICE_GATEWAY_HEARTBEAT_S": ("GATEWAY_HEARTBEAT_S", float),
    "SLUICE_GATEWAY_HOLD_LEASE_S": ("GATEWAY_HOLD_LEASE_S", float),
    "SLUICE_GATEWAY_METRICS_TOKEN": ("GATEWAY_METRICS_TOKEN", str),
    "SLUICE_GATEWAY_CACHE_WARM": ("GATEWAY_CACHE_WARM", lambda v: v.lower() in {"1", "true", "yes", "on"}),
    "SLUICE_EMBEDDING_BACKEND": ("EMBEDDING_BACKEND", str),
    "SLUICE_EMBEDDING_THREADS": ("EMBEDDING_THREADS", int),
    "SLUICE_EMBEDDING_CACHE_DIR": ("EMBEDDING_CACHE_DIR", str),
    "SLUICE_EMBEDDING_URL": ("EMBEDDING_URL", str),
    "SLUICE_EMBEDDING_BATCH_MAX": ("EMBEDDING_BATCH_MAX", int),
    "SLUICE_EMBEDDING_BATCH_WAIT_MS": ("EMBEDDING_BATCH_WAIT_MS", float),
    "SLUICE_EMBEDDING_TIMEOUT_S": ("EMBEDDING_TIMEOUT_S", float),
    "SLUICE_CACHE_SALT_SECRET": ("CACHE_SALT_SECRET", str),
    "SLUICE_LOG_LEVEL": ("LOG_LEVEL", str),
    "SLUICE_VERBOSE": ("VERBOSE", lambda v: v.lower() in {"1", "true", "yes", "on"}),
    "SLUICE_POOLS_VAR_DIR": ("POOLS_VAR_DIR", str),
    "SLUICE_POOLS_BIND_HOST": ("POOLS_BIND_HOST", str),
    "SLUICE_POOLS_ADVERTISE_HOST": ("POOLS_ADVERTISE_HOST", str),
    "SLUICE_BUDGET_WEBHOOK_URL": ("BUDGET_WEBHOOK_URL", str),
    "SLUICE_WEBHOOK_ALLOWED_HOSTS": ("WEBHOOK_ALLOWED_HOSTS", str),
    "SLUICE_ADAPTERS_DIR": ("ADAPTERS_DIR", str),
    "SLUICE_ADAPTERS_TRAIN_QUEUE": ("ADAPTERS_TRAIN_QUEUE", str),
}

INSECURE_KEYS = {"", "dev", "dev-insecure-key", "change-me", "test"}


class Config:
    """Every config key Sluice reads, with its default: code reads ``config["KEY"]``
    (``current_app.config`` in the console and workers, the dict the gateway is built
    with), never a default of its own."""

    # Empty: outside prod, a key generated once into INSTANCE_DIR/secret_key (mode 0600)
    # and reused; prod refuses to start without a real one.
    SECRET_KEY = ""
    INSTANCE_DIR = str(VAR)
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
    GATEWAY_URL = "http://127.0.0.1:8400"   # the gateway's base URL as clients reach it
    # two-person rule: a ledger adjustment above this (USD, either sign) waits for a second
    # central FinOps user's approval before it is booked
    FINOPS_ADJUSTMENT_SECOND_PERSON_USD = 100
    CONSOLE_REVEAL_TTL_S = 120   # a new key's plaintext waits this long for the page that shows it
    GATEWAY_SNAPSHOT_POLL_S = 0.5   # how often a gateway checks the snapshot version
    GATEWAY_EJECT_S = 5.0           # a replica that failed is skipped this long
    GATEWAY_CACHE_WARM = False      # load the embedding model (and xgrammar) at gateway start
    # Bearer token for the gateway's /metrics and detailed /healthz; empty: only clients on
    # the gateway's own host (the port also serves tenants)
    GATEWAY_METRICS_TOKEN = ""
    # Ledger events are spooled here before the answer's last byte, so a killed gateway
    # loses none (the next one on the host sends them on). Empty: memory only.
    GATEWAY_LEDGER_SPOOL_DIR = str(VAR / "spool")
    GATEWAY_LEDGER_LINGER_S = 0.02  # batch ledger events this long before writing them
    # Ledger events held in memory at most; past it they wait in the spool file only and
    # are read back as the backlog drains (nothing is dropped while the spool can write)
    GATEWAY_LEDGER_MAX_BACKLOG = 200_000
    # Budget holds are leases of a gateway instance (app.contract.leases): it renews its
    # heartbeat this often (the key lives 3x as long) and a hold is given back by the
    # reaper when its gateway's heartbeat is gone or after GATEWAY_HOLD_LEASE_S
    GATEWAY_HEARTBEAT_S = 5.0
    GATEWAY_HOLD_LEASE_S = 900.0
    # Request embeddings (app.contract.cache.embedding): "auto" runs MiniLM exported to ONNX, cached
    # under EMBEDDING_CACHE_DIR (empty: $XDG_CACHE_HOME/sluice/embedding), and falls back to
    # sentence-transformers; "onnx" (no fallback), "torch", "sentence-transformers", "service".
    EMBEDDING_BACKEND = "auto"
    EMBEDDING_THREADS = 1           # onnxruntime intra-op threads per process
    EMBEDDING_CACHE_DIR = ""
    # "service": embeddings come from a server speaking Text Embeddings Inference's
    # POST /embed at EMBEDDING_URL (python -m app.contract.cache.embed_service is one)
    EMBEDDING_URL = ""
    EMBEDDING_TIMEOUT_S = 5.0       # per call to the embedding service
    # Concurrent requests' texts share one encoder call: up to EMBEDDING_BATCH_MAX texts (1:
    # no batching), waiting at most EMBEDDING_BATCH_WAIT_MS for company (0: a batch is what
    # queued while the previous one ran)
    EMBEDDING_BATCH_MAX = 32
    EMBEDDING_BATCH_WAIT_MS = 0.0
    GATEWAY_LINT_INTERVAL_S = 60.0  # write the template lint's request counts this often
    # Engines' prefix-cache salt per tenant (policy cache_salt) is an HMAC under this key;
    # empty: SECRET_KEY
    CACHE_SALT_SECRET = ""
    BUDGET_WEBHOOK_URL = ""
    # Budget webhooks go to https on public addresses, or to these hosts (comma-separated
    # names, e.g. an internal alert relay)
    WEBHOOK_ALLOWED_HOSTS = ""
    LEDGER_BATCH_SIZE = 500         # ledger events the drain commits per transaction
    # New workflows a tenant's traffic may create; past it, unknown X-Sluice-Workflow values
    # are counted under "other" (every workflow is in every gateway's snapshot)
    WORKFLOWS_PER_TENANT_MAX = 500
    SNAPSHOT_PUBLISH = True         # False: changes do not publish a snapshot (tests)
    LOG_LEVEL = "INFO"
    VERBOSE = False   # alembic INFO lines on other CLI calls (the db commands always print theirs)
    CELERY: dict[str, Any] = {}     # overrides of app.celery_binding's settings
    TESTING = False
    # S01 router training (app.cascade): labels needed, held-out share and size, quality
    # bar (share of frontier quality), training window, new labels before a retrain
    ROUTER_MIN_LABELS = 200
    ROUTER_HELDOUT_FRACTION = 0.2
    ROUTER_MIN_HELDOUT = 30
    ROUTER_QUALITY_TARGET = 0.99
    ROUTER_TRAIN_WINDOW_DAYS = 30
    ROUTER_RETRAIN_MIN_NEW_LABELS = 200
    # τ on promotion (app.cascade.regret): confidence of the upper bound on a tier's regret
    # (share of held-out requests it fails where the frontier passes) that must stay
    # within policy router_max_regret
    ROUTER_REGRET_CONFIDENCE = 0.95
    # Tier-1 exploration (app.gateway.shadow, policy explore_pct): tier-1 calls in flight
    # off the path per gateway process at most (more are skipped); 0 turns it off
    GATEWAY_EXPLORE_MAX_INFLIGHT = 4
    # Cache verification (app.gateway.cache_verify, policy cache_verify_sample_pct): sampled
    # cache hits generated again upstream off the path, in flight per gateway process at
    # most (more are skipped, the hit unchecked); 0 turns it off
    GATEWAY_CACHE_VERIFY_MAX_INFLIGHT = 4
    # Pool driver on each node (workers.pools.driver)
    POOLS_VAR_DIR = ""              # engines' logs and pid files; empty: var/ in the repo
    POOLS_BIND_HOST = "127.0.0.1"   # where engines listen
    POOLS_ADVERTISE_HOST = "127.0.0.1"  # the host in the replica URL gateways call
    POOLS_START_WAIT_S = 120        # start_replica waits this long for /health
    POOLS_START_TIMEOUT_S = 300     # the supervisor gives a starting replica this long
    POOLS_STOP_GRACE_S = 15         # SIGTERM, then SIGKILL after this
    POOLS_DRAIN_TIMEOUT_S = 120     # drain waits this long for in-flight requests
    POOLS_BACKOFF_BASE_S = 1.0      # restart backoff: base * 2^failures ...
    POOLS_BACKOFF_MAX_S = 60.0      # ... capped here
    POOLS_HEALTH_FAILURES = 2       # failed health checks before a replica is down
    POOLS_STATS_TTL_S = 30          # live replica stats in Redis expire after this
    POOLS_METRICS_RETENTION_H = 48  # ReplicaMetric rows kept this long
    # LoRA flywheel (app.adapters): the gateway samples this share of successful frontier
    # answers of a workflow into a Redis stream capped at ADAPTER_TRACE_MAXLEN entries
    # (approximate); the adapters.drain_traces task moves them into adapter_traces.
    ADAPTER_TRACE_SAMPLE = 1.0
    ADAPTER_TRACE_MAXLEN = 100_000
    ADAPTER_TRACE_BATCH_SIZE = 500  # traces the drain commits per transaction
    # Frozen datasets (datasets/<sha256>.jsonl) and content-addressed adapter artifacts
    # (artifacts/<sha256>/) live under this folder; workers and nodes must share it.
    ADAPTERS_DIR = str(VAR / "adapters")
    ADAPTERS_TRAIN_QUEUE = "training"   # Celery queue of adapters.train (a worker with -Q training)
    ADAPTERS_EVAL_MAX_NEW_TOKENS = 256  # offline evaluation: most tokens generated per sample
    ADAPTERS_EVAL_BATCH = 16            # offline evaluation: prompts generated together
    # Shadow evaluation: share of eligible answers a shadow adapter also answers, shadow
    # calls in flight per gateway process at most, verdicts before the approval gate
    ADAPTERS_SHADOW_SAMPLE_PCT = 10.0
    ADAPTERS_SHADOW_MAX_INFLIGHT = 8
    ADAPTERS_SHADOW_MIN_REQUESTS = 200
    # cost per 1k requests "before" on the adapter page: the workflow's ledger over this window
    ADAPTERS_COST_WINDOW_DAYS = 7
    # canary watch (app.adapters.watch): the least live evidence before it may roll back
    ADAPTERS_WATCH_MIN_REQUESTS = 50
    ADAPTERS_WATCH_MIN_VERDICTS = 20


class DevConfig(Config):
    pass


class TestConfig(Config):
    TESTING = True
    # The test session's one worker listens on "default" (tests/conftest.py celery_worker)
    ADAPTERS_TRAIN_QUEUE = "default"
    # Outside the repository; tests/conftest.py gives each test session a folder of its own
    # (its worker subprocesses get it as SLUICE_ADAPTERS_DIR).
    ADAPTERS_DIR = "/tmp/sluice-test-adapters"
    WTF_CSRF_ENABLED = True  # tests prove CSRF; they fetch tokens like a browser
    SQLALCHEMY_DATABASE_URI = "sqlite://"
    # Off in the session's shared test gateway: a random 5% of auto requests answered
    # again on tier 1 would add ledger rows and labels to tests that count them exactly.
    # Exploration's own tests start a gateway with it on.
    GATEWAY_EXPLORE_MAX_INFLIGHT = 0
    # Likewise cache verification: 5% of verifier hits generated again would add ledger
    # rows to tests that count them; tests/gateway/test_verified_cache.py turns it on.
    GATEWAY_CACHE_VERIFY_MAX_INFLIGHT = 0


class ProdConfig(Config):
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
    if not cfg.get("SECRET_KEY"):
        cfg["SECRET_KEY"] = instance_secret(Path(cfg["INSTANCE_DIR"]))
    return cfg


def instance_secret(instance_dir: Path) -> str:
    """This instance's own session key: read from ``instance_dir/secret_key``, or made
    there once (mode 0600, created exclusively so two processes starting together end
    up with the same key). Never a key anyone else knows."""
    path = instance_dir / "secret_key"
    instance_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        for _ in range(50):   # the creator may not have written it yet
            key = path.read_text().strip()
            if key:
                return key
            time.sleep(0.02)
        raise ConfigError(f"{path} is empty: delete it to have a new key made") from None
    key = secrets.token_urlsafe(48)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    return key
