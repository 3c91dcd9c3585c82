"""The running system bench/replay.py replays a month through, all real processes: a scratch
PostgreSQL database and Redis namespace, the control plane (this process's Flask app), a
Celery worker with beat (ledger drain, snapshot publishes, rollups), CPU reference engines
serving SmolLM2-135M for tiers 1 and 2, the gold frontier (bench/replay_gold.py) as tier 3,
and the gateway (gunicorn + uvicorn worker)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from decimal import Decimal
from pathlib import Path

import httpx
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[1]
BASE_DB = os.environ.get("SLUICE_BENCH_DATABASE_URL",
                         "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("SLUICE_REDIS_URL", "redis://127.0.0.1:6379/0")
FRONTIER_KEY = "sk-replay-frontier"
SERVED = "smollm2-135m"
# the replay's month is ~1/1000 of a production month: the router's volume thresholds are
# scaled with it (product defaults 200 / 30 / 200); the regret bound (0.008 at 95%) is not
ROUTER_SCALED = {"ROUTER_MIN_LABELS": 24, "ROUTER_MIN_HELDOUT": 5,
                 "ROUTER_RETRAIN_MIN_NEW_LABELS": 24}


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 240, proc: subprocess.Popen | None = None,
              log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited; log {log}:\n"
                               + (log.read_text()[-3000:] if log else ""))
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not come up in {timeout:.0f} s")


class Stack:
    """Start with ``start()``, stop with ``stop()`` (every process it started, and the
    scratch database and namespace unless ``keep``)."""

    def __init__(self, gold: list[dict], t1_replicas: int = 2, t2_replicas: int = 1,
                 engine_threads: int = 1, engine_model: str = "smollm2",
                 gateway_overrides: dict | None = None):
        self.gold = gold
        self.gateway_overrides = gateway_overrides or {}
        self.engine_model = engine_model
        self.t1, self.t2, self.threads = t1_replicas, t2_replicas, engine_threads
        self.tmp = Path(tempfile.mkdtemp(prefix="sluice-replay-"))
        self.db_name = f"sluice_bench_replay_{uuid.uuid4().hex[:8]}"
        self.db_url = re.sub(r"/[^/]*$", f"/{self.db_name}", BASE_DB)
        self.ns = f"sluicereplay{uuid.uuid4().hex[:8]}"
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.app = None
        self.ctx = None
        self.gateway_url = ""
        self.frontier_url = ""
        self.engine_urls: list[str] = []

    # --- processes ------------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
        env.update(SLUICE_ENV="dev", SLUICE_DATABASE_URL=self.db_url, SLUICE_REDIS_URL=REDIS_URL,
                   SLUICE_REDIS_NAMESPACE=self.ns, SLUICE_SECRET_KEY="replay-bench-secret-key-1",
                   SLUICE_QDRANT_PATH=str(self.tmp / "qdrant"), SLUICE_INSTANCE_DIR=str(self.tmp),
                   SLUICE_GATEWAY_LEDGER_SPOOL_DIR=str(self.tmp / "spool"),
                   SLUICE_GATEWAY_SNAPSHOT_POLL_S="0.2", SLUICE_PROVIDER_KEY_FRONTIER=FRONTIER_KEY,
                   SLUICE_ADAPTERS_DIR=str(self.tmp / "adapters"),
                   SLUICE_ADAPTERS_TRAIN_QUEUE="default",
                   HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
                   PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
        return env

    def _spawn(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "wb")
        proc = subprocess.Popen(argv, cwd=ROOT, env=env or self._env(), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append((name, proc))
        return proc

    def start(self) -> "Stack":
        admin = sa.create_engine(BASE_DB, isolation_level="AUTOCOMMIT")
        with admin.connect() as c:
            c.execute(sa.text(f'CREATE DATABASE "{self.db_name}"'))
        admin.dispose()
        from app.extensions import db
        from app.factory import create_app
        self.app = create_app({"SQLALCHEMY_DATABASE_URI": self.db_url, "REDIS_URL": REDIS_URL,
                               "REDIS_NAMESPACE": self.ns, "SECRET_KEY": "replay-bench-secret-key-1",
                               "QDRANT_PATH": str(self.tmp / "qdrant-cp"),
                               "SERVER_NAME": "localhost", "ADAPTERS_DIR": str(self.tmp / "adapters"),
                               "ADAPTERS_TRAIN_QUEUE": "default", **ROUTER_SCALED}, env="test")
        self.ctx = self.app.app_context()
        self.ctx.push()
        db.create_all()
        gold_file = self.tmp / "gold.json"
        gold_file.write_text(json.dumps(self.gold))
        port_file = self.tmp / "frontier.port"
        py = sys.executable
        fr = self._spawn("frontier", [py, str(ROOT / "bench" / "replay_gold.py"),
                                      str(gold_file), str(port_file)])
        ports = [_free_port() for _ in range(self.t1 + self.t2)]
        # runtime LoRA on (the adapters' hot-load); idle unless an adapter is loaded. At
        # most one adapter per tenant workflow is held (shadow or serving; a retired one is
        # unloaded): the month's 10 workflows and room for a superseded one in between
        # (8 left two workflows without a slot)
        lora_env = {**self._env(), "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
        engines = [self._spawn(f"engine-{i}", [py, "-m", "app.engine", "--model", self.engine_model,
                                                "--served-model-name", SERVED, "--port", str(p),
                                                "--threads", str(self.threads), "--max-loras", "12",
                                                "--enable-prompt-tokens-details"], env=lora_env)
                   for i, p in enumerate(ports)]
        self.engine_urls = [f"http://127.0.0.1:{p}" for p in ports]
        celery = str(Path(py).with_name("celery"))
        self._spawn("worker", [celery, "-A", "workers.celery_app", "worker", "-B", "--pool",
                               "solo", "-Q", "default", "-s", str(self.tmp / "beat-schedule"),
                               "-n", f"replay-{self.ns}@%h", "--loglevel", "WARNING",
                               "--without-mingle", "--without-gossip"])
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text():
            if time.monotonic() > deadline or fr.poll() is not None:
                raise RuntimeError((self.tmp / "frontier.log").read_text()[-2000:])
            time.sleep(0.1)
        self.frontier_url = f"http://127.0.0.1:{port_file.read_text()}"
        for i, (url, proc) in enumerate(zip(self.engine_urls, engines)):
            wait_http(url + "/health", 300, proc, self.tmp / f"engine-{i}.log")
        self.seed_catalog()
        from app.snapshot.service import publish
        publish()   # the gateway answers /healthz once it has a snapshot
        gw_port = _free_port()
        gunicorn = str(Path(py).with_name("gunicorn"))
        app_spec = "app.gateway.asgi:create_gateway()" if not self.gateway_overrides else \
            f"replay_gateway:create({json.dumps(json.dumps(self.gateway_overrides))})"
        gw = self._spawn("gateway", [gunicorn, "-k", "uvicorn.workers.UvicornWorker", "-w", "1",
                                     "-b", f"127.0.0.1:{gw_port}", "--log-level", "warning",
                                     "--pythonpath", str(ROOT / "bench"),
                                     "--timeout", "300", app_spec])
        self.gateway_url = f"http://127.0.0.1:{gw_port}"
        wait_http(self.gateway_url + "/healthz", 180, gw, self.tmp / "gateway.log")
        self.publish()
        return self

    def stop(self, keep_db: bool = False) -> None:
        for name, proc in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for name, proc in reversed(self.procs):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        if self.ctx is not None:
            from app.extensions import db
            db.session.remove()
            db.engine.dispose()
            self.ctx.pop()
            self.ctx = None
        if not keep_db:
            self.drop()

    def drop(self) -> None:
        admin = sa.create_engine(BASE_DB, isolation_level="AUTOCOMMIT")
        with admin.connect() as c:
            c.execute(sa.text(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)'))
        admin.dispose()
        import redis
        r = redis.Redis.from_url(REDIS_URL)
        for key in r.scan_iter(f"{self.ns}:*", count=1000):
            r.delete(key)

    # --- control plane ----------------------------------------------------------------
    def seed_catalog(self) -> None:
        """Two pools of reference engines (tier 1: ``t1`` replicas, tier 2: ``t2``) and the
        seed's three tiers at the seed's prices (app.commands.SEED_TIERS: one per-token
        price for input and output, cached input at a quarter)."""
        from app.auth.models import User
        from app.catalog.models import Pool, Replica, Tier
        from app.commands import SEED_TIERS
        from app.extensions import db
        from app.policies.models import Policy
        from app.security import hash_password
        urls = {1: self.engine_urls[:self.t1], 2: self.engine_urls[self.t1:]}
        pools = {}
        for rank in (1, 2):
            pool = Pool(name=f"tier{rank}-smollm2", engine="reference", model="smollm2",
                        served_model_name=SERVED, desired_replicas=len(urls[rank]), options={})
            db.session.add(pool)
            db.session.flush()
            for i, url in enumerate(urls[rank]):
                db.session.add(Replica(pool_id=pool.id, index=i, url=url, state="healthy"))
            pools[rank] = pool
        for t in SEED_TIERS:
            price, pool = t["price"], pools.get(t["rank"])
            db.session.add(Tier(
                name=t["name"], rank=t["rank"],
                model=SERVED if pool else "frontier-model",
                price_input_per_m=price, price_cached_input_per_m=price / 4,
                price_output_per_m=price, upstream_kind="pool" if pool else "external",
                pool_id=pool.id if pool else None,
                endpoint_url="" if pool else self.frontier_url + "/v1",
                api_key_env="" if pool else "SLUICE_PROVIDER_KEY_FRONTIER",
                timeout_s=300.0))
        db.session.add(Policy(tenant_id=None, values={}))
        db.session.add(User(email="finops@replay.example", role="admin",
                            password_hash=hash_password("Replay-pass-123")))
        # the flywheel's people (bench/replay_flywheel.py): an ML engineer who asks for
        # trainings and an approver who is not the requester (four eyes)
        people = {"ml": User(email="ml@replay.example", role="ops",
                             password_hash=hash_password("Replay-pass-123")),
                  "approver": User(email="approver@replay.example", role="approver",
                                   password_hash=hash_password("Replay-pass-123"))}
        db.session.add_all(people.values())
        db.session.commit()
        from app.auth.service import create_admin_token
        self.tokens = {who: create_admin_token(u, "replay")[1] for who, u in people.items()}

    def api(self, method: str, path: str, who: str, body: dict | None = None):
        """The control plane's admin API (this process's Flask app, through its test
        client: the same views, auth and services), as ``who`` ("ml" or "approver")."""
        client = self.app.test_client()
        return client.open(path, method=method, json=body if body is not None else None,
                           headers={"Authorization": f"Bearer {self.tokens[who]}"})

    def make_tenant(self, name: str, department: str, policy: dict) -> tuple[int, str]:
        from app.extensions import db
        from app.policies.models import Policy
        from app.security import KEY_PREFIX, new_token
        from app.tenants.models import ApiKey, Tenant
        tenant = Tenant(name=name, department=department)
        db.session.add(tenant)
        db.session.flush()
        db.session.add(Policy(tenant_id=tenant.id, values=policy))
        key, prefix, digest = new_token(KEY_PREFIX)
        db.session.add(ApiKey(tenant_id=tenant.id, name="replay", prefix=prefix, key_hash=digest))
        db.session.commit()
        return tenant.id, key

    def set_policy(self, tenant_ids: list[int], values: dict, *, replace: bool = False) -> None:
        """Merge ``values`` into these tenants' policy, or with ``replace`` set it to exactly
        them (an ablation pass: the stage it switched off is switched back on by the next
        pass's values, not left behind)."""
        from app.extensions import db
        from app.policies.models import Policy
        for p in db.session.scalars(db.select(Policy).where(Policy.tenant_id.in_(tenant_ids))):
            p.values = dict(values) if replace else {**p.values, **values}
        db.session.commit()
        self.publish()

    def policy_values(self, tenant_id: int) -> dict:
        from app.extensions import db
        from app.policies.models import Policy
        db.session.expire_all()
        return dict(db.session.scalar(db.select(Policy.values).where(Policy.tenant_id == tenant_id)))

    def router_versions(self, tenant_ids: list[int]) -> dict[str, int]:
        """scope -> active router version of these tenants (an ablation checks that its
        passes ran on the same routers: beat's hourly router.schedule_training still runs)."""
        from app.cascade.models import RouterModel
        from app.extensions import db
        db.session.expire_all()
        mine = {str(t) for t in tenant_ids}
        return {m.scope: m.version for m in db.session.scalars(
            db.select(RouterModel).where(RouterModel.status == "active"))
            if m.scope == "global" or m.scope.split(":")[1] in mine}

    def cache_snapshot(self) -> dict[bytes, tuple[bytes, int]]:
        """Every cache key of this stack's namespace (entries, buckets, indexes), dumped
        with its remaining TTL: the state an ablation's passes each start from."""
        import redis
        from app.contract.keys import Keys
        r = redis.Redis.from_url(REDIS_URL)
        out = {}
        for key in r.scan_iter(Keys(self.ns).cache("*"), count=1000):
            raw, ttl = r.dump(key), r.pttl(key)
            if raw is not None:
                out[key] = (raw, max(ttl, 0))    # pttl -1: no expiry -> RESTORE ttl 0
        return out

    def cache_restore(self, snap: dict[bytes, tuple[bytes, int]]) -> int:
        """Drop every cache key of the namespace (what the pass before wrote and evicted)
        and put ``snap`` back; returns the keys restored."""
        import redis
        from app.contract.keys import Keys
        r = redis.Redis.from_url(REDIS_URL)
        keys = list(r.scan_iter(Keys(self.ns).cache("*"), count=1000))
        for i in range(0, len(keys), 500):
            r.delete(*keys[i:i + 500])
        pipe = r.pipeline(transaction=False)
        for key, (raw, ttl) in snap.items():
            pipe.restore(key, ttl, raw, replace=True)
        pipe.execute()
        return len(snap)

    def publish(self) -> int:
        from app.snapshot.service import publish
        version = publish()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            got = httpx.get(self.gateway_url + "/healthz", timeout=5).json()
            if (got.get("snapshot_version") or 0) >= version:
                return version
            time.sleep(0.1)
        raise RuntimeError("the gateway did not load the snapshot")

    def engines_idle(self, urls: list[str], timeout: float = 900) -> float:
        """Wait until ``urls``' engines have nothing running or waiting (two polls in a
        row); returns the seconds waited."""
        t0 = time.monotonic()
        quiet = 0
        while time.monotonic() - t0 < timeout:
            busy = 0.0
            for url in urls:
                try:
                    text = httpx.get(url + "/metrics", timeout=5).text
                except httpx.HTTPError:
                    continue
                for line in text.splitlines():
                    if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")):
                        busy += float(line.rsplit(" ", 1)[1])
            quiet = quiet + 1 if busy == 0 else 0
            if quiet >= 2:
                break
            time.sleep(0.5)
        return time.monotonic() - t0

    def drain(self) -> int:
        """What the worker's ledger.drain runs every 2 s, run now (the compressed clock
        cannot wait for beat)."""
        from app.ledger.service import drain_stream
        return drain_stream(max_batches=200, min_idle_ms=5_000)

    def train_due_routers(self) -> list[dict]:
        """What beat's router.schedule_training + router.train do, for every due scope."""
        from app.cascade.schedule import due_scopes
        from app.cascade.traces import train_from_ledger
        return [train_from_ledger(d["scope"]) for d in due_scopes()]

    def wait_ledger(self, tenant_ids: list[int], requests: int, verdicts: int,
                    timeout: float = 180) -> int:
        """Drain until the ledger holds ``requests`` rows of these tenants and ``verdicts``
        of them carry their feedback; returns the rows found (fewer on timeout)."""
        from replay_ledger import count_rows
        deadline = time.monotonic() + timeout
        rows = judged = 0
        while time.monotonic() < deadline:
            self.drain()
            rows, judged = count_rows(tenant_ids)
            if rows >= requests and judged >= verdicts:
                break
            time.sleep(0.5)
        return rows
