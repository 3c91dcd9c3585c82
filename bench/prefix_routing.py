"""Prefix-cache hit rate on 4 real reference-engine replicas: round-robin vs Sluice's
replica choice (rendezvous hashing with bounded load, live in-flight counts in Redis).

    .venv/bin/python bench/prefix_routing.py [--model smollm2|tiny|PATH] [--replicas 4]
        [--sessions 16] [--turns 5] [--teams 4] [--context-words 60] [--kv-tokens 8000]

The same workload (multi-turn sessions plus single-shot requests that share team system
prompts) is driven twice; each arm starts fresh engine processes so no cache carries
over. The hit rate is read from the replicas' own ``/metrics`` counters
(``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries``, token-weighted), never
computed by the bench. Routing is done here, in the bench's client, with the same
``pick_replica`` and ``InflightTracker`` the gateway's S03 stage is to use; the gateway's
S03 does not call them yet, so its own choice is not what is measured.
"""
from __future__ import annotations

import argparse
import itertools
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.core.rendezvous import ReplicaView, affinity_key, sluice_choice  # noqa: E402
from app.routing.live import make_sessions, reply_text, scrape, system_prompt  # noqa: E402
from app.routing.load import InflightTracker, read_loads  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Engine:
    def __init__(self, model: str, kv_tokens: int, log_dir: Path, i: int) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log_dir / f"engine-{i}-{self.port}.log", "wb")
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.engine", "--model", model, "--served-model-name",
             "bench", "--port", str(self.port), "--threads", "1",
             "--max-prefix-tokens", str(kv_tokens)],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def wait(self, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"engine exited ({self.proc.returncode}); see {self.log.name}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise TimeoutError("engine did not become healthy")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


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
        return item["session"].next_body(rng, "bench", args.max_tokens, args.context_words)
    return {"model": "bench", "max_tokens": args.max_tokens, "temperature": 0, "messages": [
        {"role": "system", "content": system_prompt(item["team"], args.prompt_words)},
        {"role": "user", "content": f"Classify ticket {rng.randint(10_000, 99_999)}."}]}


def run_arm(policy: str, args, redis_client, ns: str, log_dir: Path) -> dict:
    engines = [Engine(args.model, args.kv_tokens, log_dir, i) for i in range(args.replicas)]
    try:
        for e in engines:
            e.wait()
        views = [ReplicaView(id=i, url=e.url) for i, e in enumerate(engines)]
        tracker = InflightTracker(redis_client, ns, gateway_id=f"bench-{policy}")
        rr = itertools.count()
        lock = threading.Lock()
        rng = random.Random(args.seed + 1)
        errors = 0
        with httpx.Client(timeout=600) as client:
            start = {i: scrape(client, e.url) for i, e in enumerate(engines)}

            def send(item: dict) -> None:
                nonlocal errors
                with lock:
                    body = body_for(item, rng, args)
                    if policy == "round_robin":
                        choice = views[next(rr) % len(views)]
                    else:
                        sess = item.get("session")
                        key = affinity_key(sess.session_id if sess else None,
                                           body["messages"][0]["content"], 4500)
                        loads = read_loads(redis_client, [v.id for v in views], ns)
                        choice = sluice_choice(key, views, loads, args.c)
                    tracker.acquire(choice.id)
                try:
                    resp = client.post(choice.url + "/v1/chat/completions", json=body)
                    ok = resp.status_code == 200
                    if "session" in item:
                        item["session"].add_reply(reply_text(resp) if ok else "")
                    if not ok:
                        errors += 1
                finally:
                    tracker.release(choice.id)

            t0 = time.perf_counter()
            for items in build_rounds(args):
                with ThreadPoolExecutor(args.workers) as pool:
                    list(pool.map(send, items))
            elapsed = time.perf_counter() - t0
            end = {i: scrape(client, e.url) for i, e in enumerate(engines)}
        q = {i: end[i]["vllm:prefix_cache_queries"] - start[i]["vllm:prefix_cache_queries"]
             for i in end}
        h = {i: end[i]["vllm:prefix_cache_hits"] - start[i]["vllm:prefix_cache_hits"]
             for i in end}
        total_q = sum(q.values())
        return {"hit_rate": sum(h.values()) / total_q if total_q else 0.0,
                "queried_tokens": total_q, "per_replica_queries": [q[i] for i in sorted(q)],
                "errors": errors, "seconds": elapsed}
    finally:
        for e in engines:
            e.stop()


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
    p.add_argument("--c", type=float, default=1.25, help="bounded-load factor")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--redis", default=os.environ.get("SLUICE_REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = p.parse_args()
    import redis
    r = redis.Redis.from_url(args.redis)
    ns = f"sluicebench{os.getpid()}"
    with tempfile.TemporaryDirectory() as tmp:
        if args.model == "tiny":
            from app.engine.model import build_tiny_llama
            args.model = str(build_tiny_llama(Path(tmp) / "tiny"))
        results = {pol: run_arm(pol, args, r, ns, Path(tmp)) for pol in ("round_robin", "sluice")}
    for key in r.scan_iter(f"{ns}:*"):
        r.delete(key)
    print(f"{args.replicas} replicas ({args.model}), prefix cache {args.kv_tokens} tokens each; "
          f"sluice: c={args.c}, {args.workers} requests in flight; "
          f"{args.sessions} sessions x {args.turns} turns (+{args.context_words} context words "
          f"each) + {args.singles} single-shot/round, "
          f"{args.teams} team prompts; hit rate from the replicas' /metrics")
    print(f"{'':22}{'round-robin':>14}{'sluice':>14}")
    rows = [("prefix hit rate", lambda x: f"{x['hit_rate']:.1%}"),
            ("queried tokens", lambda x: f"{x['queried_tokens']:,.0f}"),
            ("max/mean queries", lambda x: f"{max(x['per_replica_queries']) / (sum(x['per_replica_queries']) / len(x['per_replica_queries'])):.2f}"),
            ("errors", lambda x: str(x["errors"])),
            ("wall seconds", lambda x: f"{x['seconds']:.1f}")]
    for label, fmt in rows:
        print(f"{label:<22}{fmt(results['round_robin']):>14}{fmt(results['sluice']):>14}")


if __name__ == "__main__":
    main()
