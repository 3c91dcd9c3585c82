"""Prefix-cache hit rate on real reference-engine replicas behind the real gateway: the
tenant policy's ``replica_choice: round_robin`` against ``sluice`` (S03's rendezvous
hashing with bounded load, ``app.core.rendezvous.sluice_choice``) and ``kv_events`` (the
engines publish their KV events, a subscriber keeps the Redis index as the node worker
does, S03 matches the prompt's blocks, ``app.core.kv_routing.kv_choice``).

``--no-session-header``: clients that do not name their conversations (no
``X-Sluice-Session``), as most OpenAI clients do not.

    .venv/bin/python bench/prefix_routing.py [--model smollm2|tiny|PATH] [--replicas 4]
        [--sessions 16] [--turns 5] [--singles 8] [--teams 4] [--context-words 60]
        [--kv-tokens 8000] [--workers 2]

The same workload (multi-turn sessions sent with ``X-Sluice-Session``, plus single-shot
requests that share team system prompts) is driven twice through one gateway process
(gunicorn + uvicorn worker) that gets its config the production way: a control plane on a
throwaway SQLite database publishes the snapshot (tenant, key, tier, pool, replicas,
policy) to Redis under a throwaway namespace. Each arm starts fresh engine processes, so
no cache carries over, and publishes the tenant's ``replica_choice`` for that arm; the
bench only sends requests, S03 picks the replica. The hit rate is read from the
replicas' own ``/metrics`` counters (``vllm:prefix_cache_hits`` /
``vllm:prefix_cache_queries``, token-weighted), never computed by the bench.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.replica_routing.live import COUNTERS, make_sessions, scrape, system_prompt  # noqa: E402

# the engines' own TTFT histogram beside the hit-rate counters: what the engine took from a
# request's arrival to its first token, against the TTFT the client saw through the gateway
ENGINE_TTFT = ("vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count")

ARMS = ("round_robin", "sluice", "kv_events")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(pred, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if pred():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"timed out waiting for {what}")


class Proc:
    def __init__(self, argv: list[str], env: dict, log: Path) -> None:
        self.log = open(log, "wb")
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT)

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.log.name} exited ({self.proc.returncode})")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


def start_engine(model: str, kv_tokens: int, env: dict, log_dir: Path, i: int,
                 events: dict | None = None) -> tuple[Proc, str]:
    port = _free_port()
    extra = ["--kv-events-config", json.dumps(events)] if events else []
    proc = Proc([sys.executable, "-m", "app.engine", "--model", model, "--served-model-name",
                 "bench", "--port", str(port), "--threads", "1",
                 "--max-prefix-tokens", str(kv_tokens), *extra], env,
                log_dir / f"engine-{i}-{port}.log")
    return proc, f"http://127.0.0.1:{port}"


def kv_config(i: int) -> dict:
    pub, replay = _free_port(), _free_port()
    return {"enable_kv_cache_events": True, "publisher": "zmq",
            "endpoint": f"tcp://127.0.0.1:{pub}", "replay_endpoint": f"tcp://127.0.0.1:{replay}",
            "topic": f"kv@bench-{i}"}


def stream_chat(client: httpx.Client, url: str, body: dict, headers: dict) -> tuple[int, str, float]:
    """(status, reply text, seconds to the first content byte) of a streamed request."""
    t0 = time.perf_counter()
    ttft, parts = None, []
    with client.stream("POST", url, json={**body, "stream": True}, headers=headers) as resp:
        if resp.status_code != 200:
            resp.read()
            return resp.status_code, resp.text[:120], time.perf_counter() - t0
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                text = (choice.get("delta") or {}).get("content")
                if text:
                    ttft = ttft if ttft is not None else time.perf_counter() - t0
                    parts.append(text)
    return 200, "".join(parts), ttft if ttft is not None else time.perf_counter() - t0


class ControlPlane:
    """The console's app on a throwaway SQLite database: one tenant whose key calls tier-1,
    a pool of the engines of the running arm, and publishing of the snapshot."""

    def __init__(self, tmp: Path, redis_url: str, ns: str, model: str) -> None:
        from app.factory import create_app
        from app.catalog.models import Pool, Tier
        from app.extensions import db
        from app.policies.models import Policy
        from app.security import KEY_PREFIX, new_token
        from app.tenants.models import ApiKey, Tenant
        self.ns = ns
        self.app = create_app({"SQLALCHEMY_DATABASE_URI": f"sqlite:///{tmp / 'bench.db'}",
                               "REDIS_URL": redis_url, "REDIS_NAMESPACE": ns,
                               "QDRANT_PATH": str(tmp / "qdrant"), "SECRET_KEY": "bench"},
                              env="dev")
        self.ctx = self.app.app_context()
        self.ctx.push()
        db.create_all()
        tenant = Tenant(name="bench", department="bench")
        self.pool = Pool(name="bench-pool", model=model, served_model_name="bench",
                         engine="reference", options={})
        db.session.add_all([tenant, self.pool])
        db.session.flush()
        self.key, prefix, digest = new_token(KEY_PREFIX)
        db.session.add(ApiKey(tenant_id=tenant.id, name="bench", prefix=prefix, key_hash=digest))
        db.session.add(Tier(name="tier-1", rank=1, model="bench", upstream_kind="pool",
                            pool_id=self.pool.id, price_input_per_m=Decimal("0.06"),
                            price_cached_input_per_m=Decimal("0.015"),
                            price_output_per_m=Decimal("0.18"), timeout_s=600))
        db.session.add(Policy(tenant_id=None, values={}))
        self.policy = Policy(tenant_id=tenant.id, values={})
        db.session.add(self.policy)
        db.session.commit()
        from app.snapshot.service import publish
        publish()                      # a gateway serves only once it holds a snapshot

    def arm(self, replica_choice: str, urls: list[str]) -> int:
        """Point the pool at ``urls`` and the tenant at ``replica_choice``; publish."""
        from app.catalog.models import Replica
        from app.extensions import db
        from app.snapshot.service import publish
        for r in list(self.pool.replicas):
            db.session.delete(r)
        db.session.flush()
        for i, url in enumerate(urls):
            db.session.add(Replica(pool_id=self.pool.id, index=i, url=url, state="healthy"))
        self.policy.values = {"replica_choice": replica_choice, "session_key": "header",
                              "cache_enabled": False, "minify_enabled": False,
                              "margin_gamma": 0.0, "frontier_first_hours": 0}
        db.session.commit()
        db.session.expire_all()
        return publish()

    def replicas(self) -> list:
        return sorted(self.pool.replicas, key=lambda r: r.index)

    def close(self) -> None:
        from app.extensions import db
        db.session.remove()
        db.engine.dispose()
        self.ctx.pop()


def build_rounds(args) -> list[list[dict]]:
    """Rounds of independent requests; a session's turn t+1 is in a later round than t."""
    rng = random.Random(args.seed)
    sessions = make_sessions(args.sessions, args.teams, args.prompt_words)
    rounds = []
    for _ in range(args.turns):
        items = [{"session": s} for s in sessions]
        items += [{"team": rng.randrange(args.teams)} for _ in range(args.singles)]
        rng.shuffle(items)
        rounds.append(items)
    return rounds


def body_for(item: dict, rng: random.Random, args) -> dict:
    if "session" in item:
        return item["session"].next_body(rng, "tier-1", args.max_tokens, args.context_words)
    return {"model": "tier-1", "max_tokens": args.max_tokens, "temperature": 0, "messages": [
        {"role": "system", "content": system_prompt(item["team"], args.prompt_words)},
        {"role": "user", "content": f"Classify ticket {rng.randint(10_000, 99_999)}."}]}


def run_arm(arm: str, args, cp: ControlPlane, gateway: str, env: dict, log_dir: Path) -> dict:
    events = [kv_config(i) if arm == "kv_events" else None for i in range(args.replicas)]
    started = [start_engine(args.model, args.kv_tokens, env, log_dir, i, events[i])
               for i in range(args.replicas)]
    procs, urls = [p for p, _ in started], [u for _, u in started]
    sub = stats_path = None
    try:
        for p, u in started:
            _wait(lambda: (p.check(), httpx.get(u + "/health", timeout=2).status_code)[1]
                  == 200, 300, f"engine {u}")
        version = cp.arm(arm, urls)
        # the arm's policy must be in force before anything is sent: the kv_events warm-up
        # below, sent under the previous arm's snapshot, loaded no tokenizer, and the
        # first 77 of 120 requests then fell back to rendezvous while the tokenizer loaded
        # (bench/results/prefix_routing.txt, 2026-12-06 20:30)
        _wait(lambda: (httpx.get(gateway + "/healthz", timeout=2).json()
                       .get("snapshot_version") or 0) >= version, 30, "gateway snapshot")
        if arm == "kv_events":
            # the node worker's subscriber (workers.pools.kv_subscriber), in a process of
            # its own as in production: run in a thread of this process it took the GIL
            # from the threads that read the streams, and TTFT was timed in those
            reps = [{"id": r.id, "endpoint": e["endpoint"], "replay": e["replay_endpoint"],
                     "topic": e["topic"]} for r, e in zip(cp.replicas(), events)]
            stats_path = log_dir / "kv-subscriber-stats.json"
            sub = Proc([sys.executable, __file__, "--subscriber", args.redis, cp.ns,
                        json.dumps(reps), str(stats_path)], env, log_dir / "kv-subscriber.log")
            # the gateway loads the pool model's tokenizer on its first kv_events request
            # (falling back to rendezvous meanwhile): one unrelated request, then a pause
            httpx.post(gateway + "/v1/chat/completions", timeout=120,
                       headers={"authorization": f"Bearer {cp.key}"},
                       json={"model": "tier-1", "max_tokens": 1,
                             "messages": [{"role": "user", "content": "warm up"}]})
            time.sleep(args.tokenizer_wait)
        rng = random.Random(args.seed + 1)
        errors: list[str] = []
        headers = {"authorization": f"Bearer {cp.key}"}
        with httpx.Client(timeout=600) as client:
            start = {u: scrape(client, u, COUNTERS + ENGINE_TTFT) for u in urls}

            ttfts: list[float] = []

            def send(pair: tuple[dict, dict]) -> None:
                item, body = pair
                h = dict(headers)
                if "session" in item and not args.no_session_header:
                    h["x-sluice-session"] = item["session"].session_id
                status, text, ttft = stream_chat(client, gateway + "/v1/chat/completions",
                                                 body, h)
                if status != 200:
                    errors.append(f"{status} {text}")
                else:
                    ttfts.append(ttft)
                if "session" in item:
                    item["session"].add_reply(text if status == 200 else "")

            rounds = build_rounds(args)
            t0 = time.perf_counter()
            for items in rounds:
                bodies = [(it, body_for(it, rng, args)) for it in items]
                with ThreadPoolExecutor(args.workers) as pool:
                    list(pool.map(send, bodies))
            elapsed = time.perf_counter() - t0
            end = {u: scrape(client, u, COUNTERS + ENGINE_TTFT) for u in urls}
        q = [end[u]["vllm:prefix_cache_queries"] - start[u]["vllm:prefix_cache_queries"]
             for u in urls]
        h = [end[u]["vllm:prefix_cache_hits"] - start[u]["vllm:prefix_cache_hits"]
             for u in urls]
        ttft_n = sum(end[u][ENGINE_TTFT[1]] - start[u][ENGINE_TTFT[1]] for u in urls)
        ttft_s = sum(end[u][ENGINE_TTFT[0]] - start[u][ENGINE_TTFT[0]] for u in urls)
        import numpy as np
        return {"hit_rate": sum(h) / sum(q) if sum(q) else 0.0, "queried_tokens": sum(q),
                "engine_ttft_mean": ttft_s / ttft_n if ttft_n else 0.0,
                "ttft_mean": float(np.mean(ttfts)) if ttfts else 0.0,
                "per_replica_queries": q, "requests": sum(len(r) for r in rounds),
                "errors": errors, "seconds": elapsed,
                "ttft_p50": float(np.percentile(ttfts, 50)) if ttfts else 0.0,
                "ttft_p99": float(np.percentile(ttfts, 99)) if ttfts else 0.0,
                "subscriber": _subscriber_stats(sub, stats_path)}
    finally:
        if sub is not None:
            sub.stop()
        for p in procs:
            p.stop()


def _subscriber_stats(sub: "Proc | None", path: "Path | None") -> dict | None:
    """The subscriber process's counters, written when it stops (SIGTERM)."""
    if sub is None:
        return None
    sub.check()
    sub.stop()
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {"stats": "not written (see kv-subscriber.log)"}


def run_subscriber(redis_url: str, ns: str, reps_json: str, stats_path: str) -> None:
    """``--subscriber``: the kv_events arm's subscriber, until SIGTERM; then its counters
    go to ``stats_path``."""
    import signal
    import threading

    import redis

    from app.contract.keys import Keys
    from workers.pools.kv_subscriber import KVSubscriber
    reps = json.loads(reps_json)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    sub = KVSubscriber(redis.Redis.from_url(redis_url), Keys(ns))
    try:
        sub.run(stop, lambda: reps)
    finally:
        import resource
        use = resource.getrusage(resource.RUSAGE_SELF)
        Path(stats_path).write_text(json.dumps({**dict(sub.stats),
                                                "cpu_s": round(use.ru_utime + use.ru_stime, 2)}))
        sub.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2", help="smollm2, tiny (random 2-layer) or a path")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--singles", type=int, default=8, help="single-shot requests per round")
    p.add_argument("--teams", type=int, default=4)
    p.add_argument("--prompt-words", type=int, default=250)
    p.add_argument("--context-words", type=int, default=60,
                   help="retrieved-context words added to each session turn")
    p.add_argument("--kv-tokens", type=int, default=8000, help="prefix cache per replica")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--workers", type=int, default=2, help="requests in flight at once")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-session-header", action="store_true",
                   help="send no X-Sluice-Session (clients that do not name conversations)")
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--tokenizer-wait", type=float, default=25.0,
                   help="seconds the kv_events arm gives the gateway to load its tokenizer")
    p.add_argument("--redis", default=os.environ.get("SLUICE_REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = p.parse_args()
    import redis
    r = redis.Redis.from_url(args.redis)
    ns = f"sluicebench{uuid.uuid4().hex[:8]}"
    results = {}
    with tempfile.TemporaryDirectory(prefix="sluice-prefix-bench-") as tmp_name:
        tmp = Path(tmp_name)
        if args.model == "tiny":
            from app.engine.model import build_tiny_llama
            args.model = str(build_tiny_llama(tmp / "tiny"))
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "SLUICE_REDIS_URL": args.redis, "SLUICE_REDIS_NAMESPACE": ns,
               "SLUICE_ENV": "dev", "SLUICE_GATEWAY_LEDGER_SPOOL_DIR": str(tmp / "spool"),
               "SLUICE_QDRANT_PATH": str(tmp / "gw-qdrant"), "PYTHONPATH": str(ROOT)}
        cp = ControlPlane(tmp, args.redis, ns, args.model)
        import logging
        logging.getLogger("httpx").setLevel(logging.WARNING)
        port = _free_port()
        gateway_url = f"http://127.0.0.1:{port}"
        gunicorn = str(Path(sys.executable).with_name("gunicorn"))
        gw = Proc([gunicorn, "-k", "uvicorn.workers.UvicornWorker", "-w", "1", "-b",
                   f"127.0.0.1:{port}", "--log-level", "warning",
                   "app.gateway.asgi:create_gateway()"], env, tmp / "gateway.log")
        try:
            _wait(lambda: (gw.check(), httpx.get(gateway_url + "/healthz", timeout=2)
                           .status_code)[1] == 200, 120, "gateway")
            for arm in args.arms.split(","):
                results[arm] = run_arm(arm, args, cp, gateway_url, env, tmp)
        finally:
            gw.stop()
            cp.close()
            for key in r.scan_iter(f"{ns}:*"):
                r.delete(key)
    print(f"{args.replicas} reference-engine replicas ({Path(args.model).name}) behind the "
          f"gateway, prefix cache {args.kv_tokens} tokens each, {args.workers} requests in "
          f"flight; {args.sessions} sessions x {args.turns} turns (+{args.context_words} context"
          f" words each) + {args.singles} single-shot/round, {args.teams} team prompts; "
          f"policy replica_choice per arm; hit rate from the replicas' /metrics")
    arms = list(results)
    print(f"{'':22}" + "".join(f"{a.replace('_', '-'):>14}" for a in arms)
          + ("   (no X-Sluice-Session)" if args.no_session_header else ""))
    rows = [("prefix hit rate", lambda x: f"{x['hit_rate']:.1%}"),
            ("queried tokens", lambda x: f"{x['queried_tokens']:,.0f}"),
            ("max/mean queries", lambda x: f"{max(x['per_replica_queries']) / (sum(x['per_replica_queries']) / len(x['per_replica_queries'])):.2f}"),
            ("TTFT p50 ms", lambda x: f"{x['ttft_p50'] * 1000:,.0f}"),
            ("TTFT p99 ms", lambda x: f"{x['ttft_p99'] * 1000:,.0f}"),
            ("TTFT mean ms", lambda x: f"{x['ttft_mean'] * 1000:,.0f}"),
            ("engine TTFT mean ms", lambda x: f"{x['engine_ttft_mean'] * 1000:,.0f}"),
            ("requests", lambda x: str(x["requests"])),
            ("errors", lambda x: str(len(x["errors"]))),
            ("wall seconds", lambda x: f"{x['seconds']:.1f}")]
    for label, fmt in rows:
        print(f"{label:<22}" + "".join(f"{fmt(results[a]):>14}" for a in arms))
    for arm in arms:
        if results[arm].get("subscriber"):
            print(f"{arm} subscriber: {results[arm]['subscriber']}")
        for e in results[arm]["errors"][:3]:
            print(f"{arm} error: {e}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--subscriber"]:
        run_subscriber(*sys.argv[2:6])
    else:
        main()
