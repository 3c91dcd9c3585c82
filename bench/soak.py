"""Soak: the running system under a steady request rate for a bounded time, with faults
injected on a schedule, and what it lost, double-counted and grew by the end.

    .venv/bin/python bench/soak.py [--seconds 180] [--rate 1] [--max-tokens 6]

All real processes, started the way run.sh starts them: a private redis-server (its own
port and directory, append-only with fsync always, so restarting it is a fault we may
inject; never the shared one), a scratch PostgreSQL database, a Celery worker with beat
(ledger drain, the pool supervisor on queue ``pool.<node>``) under run.sh's respawn loop, two pools of CPU reference
engines serving SmolLM2-135M that the worker's pool driver starts and supervises, a
reference engine standing in for the tier-3 frontier, and the gateway (gunicorn + uvicorn
worker). The load is open-loop: one request every 1/rate seconds, spread over tiers 1, 2
and 3, whatever the previous ones are doing (at most 64 in flight).

Faults, at fixed fractions of the run:
  20%  kill -9 a tier-1 engine replica (the supervisor sees it and restarts it)
  45%  kill -9 the Celery worker (with beat) and its respawn loop, start them 5 s later
  70%  kill -9 the private Redis, start it again on the same port 3 s later

Printed: requests sent, answers, errors by kind, ledger rows vs answered requests (from
PostgreSQL once the ledger has drained: answered ids missing from the ledger, duplicate
request ids), the supervisor's restarts, and each process's resident memory (its whole
process group) at the start and the end, and every tenth of the run in between.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.core import procs  # noqa: E402

BASE_DB = os.environ.get("SLUICE_BENCH_DATABASE_URL",
                         "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
SECRET = "soak-bench-secret-key-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pgid: int) -> float:
    """Resident memory of every process in the group, MiB."""
    total = 0
    for s in procs.group_members(pgid):
        try:
            for line in Path(f"/proc/{s.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


class System:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.node = f"soak{uuid.uuid4().hex[:6]}"
        self.db_name = f"sluice_soak_{uuid.uuid4().hex[:8]}"
        self.db_url = re.sub(r"/[^/]*$", f"/{self.db_name}", BASE_DB)
        self.redis_port = free_port()
        self.redis_url = f"redis://127.0.0.1:{self.redis_port}/0"
        self.gw_port = free_port()
        self.frontier_port = free_port()
        self.groups: dict[str, subprocess.Popen] = {}
        self.app = self.ctx = None
        self.tenant_id = 0
        self.key = ""

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
        env.update(SLUICE_ENV="dev", SLUICE_DATABASE_URL=self.db_url,
                   SLUICE_REDIS_URL=self.redis_url, SLUICE_SECRET_KEY=SECRET,
                   SLUICE_INSTANCE_DIR=str(self.tmp), SLUICE_QDRANT_PATH=str(self.tmp / "qdrant"),
                   SLUICE_GATEWAY_LEDGER_SPOOL_DIR=str(self.tmp / "spool"),
                   SLUICE_POOLS_VAR_DIR=str(self.tmp), SLUICE_NODE=self.node,
                   SLUICE_GATEWAY_SNAPSHOT_POLL_S="0.5",
                   HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
                   PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
        return env

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "ab")
        p = subprocess.Popen(argv, cwd=ROOT, env=self.env(), stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        self.groups[name] = p
        return p

    def kill9(self, name: str) -> None:
        p = self.groups[name]
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(timeout=30)

    # --- processes ----------------------------------------------------------------------
    def start_redis(self) -> None:
        (self.tmp / "redis").mkdir(exist_ok=True)
        self.spawn("redis", [shutil.which("redis-server") or "redis-server",
                             "--port", str(self.redis_port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "yes", "--appendfsync", "always",
                             "--dir", str(self.tmp / "redis")])
        import redis
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if redis.Redis.from_url(self.redis_url).ping():
                    return
            except redis.RedisError:
                time.sleep(0.1)
        raise RuntimeError("private redis did not start")

    def start_worker(self) -> None:
        # as run.sh: under a respawn loop, in one process group with it
        celery = str(Path(sys.executable).with_name("celery"))
        self.spawn("worker", ["bash", "-c", 'while :; do "$@"; echo "run: worker exited ($?), '
                              'restarting in 2 s"; sleep 2; done', "worker",
                              celery, "-A", "workers.celery_app", "worker", "-B",
                              "--schedule", str(self.tmp / "beat-schedule"),
                              "-Q", f"default,pool.{self.node}", "--concurrency", "2",
                              "-n", f"{self.node}@%h", "--loglevel", "INFO"])

    def worker_respawns(self) -> int:
        try:
            return (self.tmp / "worker.log").read_text(errors="replace").count(
                "run: worker exited")
        except OSError:
            return 0

    def start(self) -> None:
        admin = sa.create_engine(BASE_DB, isolation_level="AUTOCOMMIT")
        with admin.connect() as c:
            c.execute(sa.text(f'CREATE DATABASE "{self.db_name}"'))
        admin.dispose()
        self.start_redis()
        from app.extensions import db
        from app.factory import create_app
        self.app = create_app({"SQLALCHEMY_DATABASE_URI": self.db_url, "REDIS_URL": self.redis_url,
                               "SECRET_KEY": SECRET, "POOLS_VAR_DIR": str(self.tmp),
                               "QDRANT_PATH": str(self.tmp / "qdrant-cp")}, env="dev")
        self.ctx = self.app.app_context()
        self.ctx.push()
        db.create_all()
        self.seed()
        py = sys.executable
        self.spawn("frontier", [py, "-m", "app.engine", "--model", "smollm2",
                                "--served-model-name", "frontier", "--host", "127.0.0.1",
                                "--port", str(self.frontier_port), "--threads", "1"])
        self.start_worker()
        from app.audit.service import SYSTEM
        from app.catalog.models import Pool
        from app.pools.service import request_pool_action
        for pool in db.session.scalars(db.select(Pool)):
            request_pool_action(SYSTEM, pool.id, "start")
        db.session.commit()
        gunicorn = str(Path(py).with_name("gunicorn"))
        self.spawn("gateway", [gunicorn, "-k", "uvicorn.workers.UvicornWorker", "-w", "1",
                               "-b", f"127.0.0.1:{self.gw_port}", "--log-level", "warning",
                               "--timeout", "300", "app.gateway.asgi:create_gateway()"])
        wait_http(f"http://127.0.0.1:{self.frontier_port}/health", 300)
        wait_http(f"http://127.0.0.1:{self.gw_port}/healthz", 180)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and self.replica_states().count("healthy") < 2:
            time.sleep(1)
        if self.replica_states().count("healthy") < 2:
            raise RuntimeError(f"replicas not healthy: {self.replica_states()}")
        from app.snapshot.service import publish
        publish()
        time.sleep(2)

    def seed(self) -> None:
        from decimal import Decimal

        from app.catalog.models import Pool, Tier
        from app.catalog.service import sync_replica_rows
        from app.extensions import db
        from app.policies.models import Policy
        from app.security import KEY_PREFIX, new_token
        from app.tenants.models import ApiKey, Tenant
        pools = {}
        for rank in (1, 2):
            pool = Pool(name=f"soak-t{rank}", node=self.node, engine="reference", model="smollm2",
                        served_model_name=f"soak-t{rank}", desired_replicas=1,
                        base_port=free_port(), options={"threads": 1})
            db.session.add(pool)
            db.session.flush()
            sync_replica_rows(pool)
            pools[rank] = pool
        for rank, price in ((1, "0.06"), (2, "0.35"), (3, "3.50")):
            p = Decimal(price)
            pool = pools.get(rank)
            db.session.add(Tier(name=f"tier-{rank}", rank=rank,
                                model=pool.served_model_name if pool else "frontier",
                                price_input_per_m=p, price_cached_input_per_m=p / 4,
                                price_output_per_m=p,
                                upstream_kind="pool" if pool else "external",
                                pool_id=pool.id if pool else None,
                                endpoint_url="" if pool else
                                f"http://127.0.0.1:{self.frontier_port}/v1",
                                api_key_env="", timeout_s=120.0))
        db.session.add(Policy(tenant_id=None, values={"cache_enabled": False,
                                                      "explore_pct": 0.0}))
        tenant = Tenant(name="soak", department="bench")
        db.session.add(tenant)
        db.session.flush()
        db.session.add(Policy(tenant_id=tenant.id, values={}))
        key, prefix, digest = new_token(KEY_PREFIX)
        db.session.add(ApiKey(tenant_id=tenant.id, name="soak", prefix=prefix, key_hash=digest))
        db.session.commit()
        self.tenant_id, self.key = tenant.id, key

    def replicas(self) -> list:
        from app.catalog.models import Pool, Replica
        from app.extensions import db
        db.session.expire_all()
        rows = list(db.session.scalars(db.select(Replica).join(Pool).where(
            Pool.node == self.node).order_by(Replica.id)))
        db.session.commit()
        return rows

    def replica_states(self) -> list[str]:
        return [r.state for r in self.replicas()]

    def memory(self) -> dict[str, tuple[int, float]]:
        """role -> (group leader pid, RSS MiB of its group)."""
        out = {name: (p.pid, rss_mb(p.pid)) for name, p in self.groups.items()
               if p.poll() is None}
        for r in self.replicas():
            if r.pid:
                out[f"engine {r.name}"] = (r.pid, rss_mb(r.pid))
        return out

    def kv_usage(self) -> dict[str, float]:
        """engine role -> its prefix KV cache's usage (``vllm:kv_cache_usage_perc``, a share
        of ``--max-prefix-tokens``): memory that tracks it is the bounded cache filling."""
        urls = {"frontier": f"http://127.0.0.1:{self.frontier_port}"}
        urls.update({f"engine {r.name}": r.url.removesuffix("/v1") for r in self.replicas()
                     if r.url})
        out = {}
        for role, url in urls.items():
            try:
                text = httpx.get(f"{url}/metrics", timeout=5).text
            except httpx.HTTPError:
                continue
            m = re.search(r"^vllm:kv_cache_usage_perc\{[^}]*\} ([0-9.eE+-]+)$", text, re.M)
            if m:
                out[role] = float(m.group(1))
        return out

    def ledger(self) -> tuple[int, set[str]]:
        from app.extensions import db
        from app.ledger.models import LedgerEntry
        db.session.expire_all()
        ids = list(db.session.scalars(db.select(LedgerEntry.request_id).where(
            LedgerEntry.tenant_id == self.tenant_id)))
        db.session.commit()
        return len(ids), set(ids)

    def stop(self) -> None:
        if "worker" in self.groups and self.groups["worker"].poll() is None:
            procs.stop(self.groups["worker"].pid, grace_s=20)
        if self.ctx is not None:
            from workers.pools import driver
            for r in self.replicas():
                try:
                    driver.stop_replica(r.id)
                except Exception as exc:  # noqa: BLE001 - still stop the rest
                    print(f"stopping replica {r.name}: {exc}", file=sys.stderr)
        for name, p in reversed(list(self.groups.items())):
            procs.stop(p.pid, grace_s=20)
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if self.ctx is not None:
            from app.extensions import db
            db.session.remove()
            db.engine.dispose()
            self.ctx.pop()
            self.ctx = None
        admin = sa.create_engine(BASE_DB, isolation_level="AUTOCOMMIT")
        with admin.connect() as c:
            c.execute(sa.text(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)'))
        admin.dispose()


def wait_http(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=3).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not come up in {timeout:.0f} s")


class Load:
    def __init__(self, url: str, key: str, max_tokens: int):
        self.url, self.key, self.max_tokens = url, key, max_tokens
        self.sent = 0
        self.answered: list[str] = []
        self.errors: collections.Counter[str] = collections.Counter()
        self.latencies: list[float] = []

    async def one(self, client: httpx.AsyncClient, i: int) -> None:
        model = ("tier-1", "tier-2", "tier-3")[i % 3]
        body = {"model": model, "max_tokens": self.max_tokens,
                "messages": [{"role": "user", "content": f"Soak request {i}: say hello."}]}
        t0 = time.monotonic()
        try:
            r = await client.post(self.url + "/v1/chat/completions", json=body,
                                  headers={"Authorization": f"Bearer {self.key}"})
        except httpx.HTTPError as exc:
            self.errors[f"client {type(exc).__name__}"] += 1
            return
        if r.status_code == 200:
            self.answered.append(r.headers.get("x-request-id", ""))
            self.latencies.append(time.monotonic() - t0)
            return
        try:
            err = r.json().get("error", {})
            code = err.get("code") or err.get("type") or ""
        except ValueError:
            code = "non-json"
        self.errors[f"HTTP {r.status_code} {code}".strip()] += 1

    async def run(self, seconds: float, rate: float, faults) -> None:
        inflight: set[asyncio.Task] = set()
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            t0 = time.monotonic()
            i = 0
            while time.monotonic() - t0 < seconds:
                await faults.tick(time.monotonic() - t0)
                due = t0 + i / rate
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                if len(inflight) >= 64:
                    self.errors["client skipped (64 in flight)"] += 1
                else:
                    task = asyncio.create_task(self.one(client, i))
                    inflight.add(task)
                    task.add_done_callback(inflight.discard)
                    self.sent += 1
                i += 1
            if inflight:
                await asyncio.wait(inflight, timeout=180)


class Faults:
    def __init__(self, system: System, seconds: float):
        self.s = system
        self.plan = [(0.20, "kill -9 a tier-1 engine replica", self.kill_engine),
                     (0.45, "kill -9 the Celery worker, restart it 5 s later", self.kill_worker),
                     (0.70, "kill -9 the private Redis, restart it 3 s later", self.kill_redis)]
        self.seconds = seconds
        self.done: list[str] = []
        self.killed_engine = 0
        # memory every tenth of the run: growth that stops after the first requests is
        # warm-up (weights paged in, allocator pools); growth that keeps going is a leak
        self.samples: list[tuple[float, dict[str, tuple[int, float]]]] = []
        self.sample_at = [k / 10 for k in range(1, 10)]
        self.kv: list[tuple[float, dict[str, float]]] = []

    async def tick(self, elapsed: float) -> None:
        while self.sample_at and elapsed >= self.sample_at[0] * self.seconds:
            self.sample_at.pop(0)
            self.samples.append((elapsed, await asyncio.to_thread(self.s.memory)))
            self.kv.append((elapsed, await asyncio.to_thread(self.s.kv_usage)))
        while self.plan and elapsed >= self.plan[0][0] * self.seconds:
            frac, what, fn = self.plan.pop(0)
            detail = await fn()
            line = f"t={elapsed:5.1f}s  {what}: {detail}"
            print("  fault " + line, flush=True)
            self.done.append(line)

    async def kill_engine(self) -> str:
        r = next(r for r in self.s.replicas() if r.name.startswith("soak-t1"))
        self.killed_engine = r.pid
        os.killpg(r.pid, signal.SIGKILL)
        return f"replica {r.name} pid {r.pid}"

    async def kill_worker(self) -> str:
        old = self.s.groups["worker"].pid
        await asyncio.to_thread(self.s.kill9, "worker")
        await asyncio.sleep(5)
        self.s.start_worker()
        return f"pid {old} -> {self.s.groups['worker'].pid}"

    async def kill_redis(self) -> str:
        old = self.s.groups["redis"].pid
        await asyncio.to_thread(self.s.kill9, "redis")
        await asyncio.sleep(3)
        await asyncio.to_thread(self.s.start_redis)
        return f"pid {old} -> {self.s.groups['redis'].pid}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=180.0)
    ap.add_argument("--rate", type=float, default=1.0, help="requests per second")
    ap.add_argument("--max-tokens", type=int, default=6)
    ap.add_argument("--drain-s", type=float, default=120.0,
                    help="longest wait for the ledger to take every answered request")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import logging
    logging.getLogger("httpx").setLevel(logging.WARNING)   # not one line per request
    tmp = Path(tempfile.mkdtemp(prefix="sluice-soak-"))
    system = System(tmp)
    try:
        t_start = time.monotonic()
        system.start()
        print(f"soak: system up in {time.monotonic() - t_start:.0f} s (logs in {tmp}); "
              f"{args.rate:g} req/s for {args.seconds:g} s, max_tokens {args.max_tokens}",
              flush=True)
        mem0 = system.memory()
        load = Load(f"http://127.0.0.1:{system.gw_port}", system.key, args.max_tokens)
        faults = Faults(system, args.seconds)
        asyncio.run(load.run(args.seconds, args.rate, faults))
        answered = {i for i in load.answered if i}
        deadline = time.monotonic() + args.drain_s
        rows, ids = system.ledger()
        while time.monotonic() < deadline and not answered <= ids:
            time.sleep(2)
            rows, ids = system.ledger()
        time.sleep(5)   # anything still arriving (booked errors) lands before the count
        rows, ids = system.ledger()
        mem1 = system.memory()
        kv1 = system.kv_usage()
        restarts = {r.name: (r.restarts, r.state) for r in system.replicas()}
        lat = sorted(load.latencies)

        def pct(q: float) -> str:
            return f"{lat[min(len(lat) - 1, int(q * len(lat)))]:.2f} s" if lat else "-"

        print("\n== soak result ==")
        print(f"duration            {args.seconds:g} s at {args.rate:g} req/s "
              f"(tiers 1/2/3 in turn, max_tokens {args.max_tokens})")
        print(f"requests sent       {load.sent}")
        print(f"answered 200        {len(load.answered)}  (latency p50 {pct(0.5)}, "
              f"p99 {pct(0.99)})")
        errs = sum(load.errors.values())
        print(f"errors              {errs}")
        for kind, n in load.errors.most_common():
            print(f"  {n:6d}  {kind}")
        print("faults injected")
        for line in faults.done:
            print(f"  {line}")
        print(f"ledger rows         {rows} (tenant's rows in PostgreSQL after drain)")
        print(f"  answered requests in the ledger     {len(answered & ids)} of {len(answered)}")
        print(f"  answered requests missing (lost)    {len(answered - ids)}")
        print(f"  duplicate request ids (double)      {rows - len(ids)}")
        print(f"  rows for requests not answered 200  {len(ids - answered)} "
              "(errors the gateway booked)")
        print(f"worker respawns    {system.worker_respawns()} (its loop restarted an exited "
              "worker; the kill -9 fault replaces the whole group instead)")
        print("replicas (restarts, state)")
        for name, (n, state) in restarts.items():
            print(f"  {name:12s} {n} restart(s), {state}")
        print("memory (RSS of each process group, MiB)   start -> end")
        for role in sorted(set(mem0) | set(mem1)):
            a, b = mem0.get(role), mem1.get(role)
            fa = f"{a[1]:7.1f} (pid {a[0]})" if a else "      -"
            fb = f"{b[1]:7.1f} (pid {b[0]})" if b else "      -"
            print(f"  {role:22s} {fa:>22s} -> {fb}")
        series = [(0.0, mem0), *faults.samples, (args.seconds, mem1)]
        print("memory over the run (MiB; * = a new pid, after a fault)")
        print("  " + " " * 22 + "".join(f"{f't={t:.0f}s':>9s}" for t, _ in series))
        for role in sorted(set(mem0) | set(mem1)):
            cells, pid = [], None
            for _, m in series:
                v = m.get(role)
                if v is None:
                    cells.append(f"{'-':>9s}")
                    continue
                mark = "*" if pid is not None and v[0] != pid else " "
                pid = v[0]
                cells.append(f"{v[1]:8.1f}{mark}")
            print(f"  {role:22s}" + "".join(cells))
        kv_series = [*faults.kv, (args.seconds, kv1)]
        print("engine prefix KV cache usage (share of --max-prefix-tokens; the engines' "
              "vllm:kv_cache_usage_perc)")
        print("  " + " " * 22 + "".join(f"{f't={t:.0f}s':>9s}" for t, _ in kv_series))
        for role in sorted({r for _, k in kv_series for r in k}):
            print(f"  {role:22s}" + "".join(
                f"{k[role]:9.1%}" if role in k else f"{'-':>9s}" for _, k in kv_series))
        return 0 if not (answered - ids) and rows == len(ids) else 1
    finally:
        system.stop()
        left = [s.pid for s in procs.all_stats()
                if any(s.pgrp == p.pid for p in system.groups.values())
                and s.state not in ("Z", "X")]
        print(f"soak: stopped; processes left: {len(left)}")


if __name__ == "__main__":
    sys.exit(main())
