"""Added latency of the gateway over calling the same fast local upstream directly.

    .venv/bin/python bench/gateway_overhead.py [--seconds 4] [--levels 1,32,256]
                                               [--litellm /tmp/litellm-venv] [--cacheable]

Real processes: a minimal OpenAI-compatible upstream (uvicorn), the gateway (gunicorn +
uvicorn worker, 1 worker: this is a 2-core box shared with the upstream and the load
generator), and a load generator process that holds N keep-alive connections and sends
non-streaming chat completions back to back for a fixed time. For each concurrency it
prints p50/p99 latency and req/s direct, through the gateway, and through LiteLLM's proxy
(if a venv with ``litellm[proxy]`` exists at --litellm or $SLUICE_BENCH_LITELLM),
and the added p50/p99 over direct. The gateway gets its config the production way: a
snapshot in Redis ($SLUICE_REDIS_URL, a throwaway namespace), and spools its ledger
events as in production.

The default request has no ``temperature`` (OpenAI's default, 1.0), so S00 does not
probe the cache: that is the proxy's own overhead. ``--cacheable`` adds two rows, the same
gateway sent ``temperature: 0`` requests that each differ (all cache misses):

- ``sluice+s00``: "Say hello to customer <n>": each names its own entity, so each has a
  bucket of its own (empty): S00 builds the key, looks up exactly, finds nothing to compare
  by meaning and stores the answer with its text (no embedding until a later request reaches
  that bucket). This is extraction/classification traffic keyed by order or customer ids.
- ``s00-shared``: entity-free questions ("Say hello to the <w1> <w2> <w3> customer.") that
  all land in one bucket, so every request pays a MiniLM embedding for its semantic lookup
  (micro-batched across concurrent requests) against a bucket that grows by every answer.

``SLUICE_EMBEDDING_BATCH_MAX=1`` in the environment turns the micro-batcher off, to compare.

``--s03`` adds two rows where S03 chooses among 4 replicas of a pool (all served by the same
fast upstream) for a ~600-token prompt: ``s03-sluice`` (today's rendezvous with bounded
load) and ``s03-kv`` (``replica_choice: kv_events``: the prompt is templated and tokenized
with SmolLM2's tokenizer, hashed into blocks and matched against the KV-block index in
Redis, which the bench keeps fresh and in which one replica holds the prompt's blocks).
Every request of those rows is the same, so after the first the gateway finds the whole
prompt's ids and keys in its caches. ``--s03-new-turns`` adds the pair again
(``s03n-sluice``, ``s03n-kv``) with a new user question per request after the same system
prompt, as real traffic is: the kv_events gateway then tokenizes and hashes each new turn.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEY = "sk-sl-bench-" + hashlib.sha256(b"sluice-bench").hexdigest()[:40]
# --s03: tenants 2 (replica_choice sluice) and 3 (kv_events) on a 4-replica pool tier
S03_KEYS = {"s03": "sk-sl-bench-" + hashlib.sha256(b"sluice-bench-s03").hexdigest()[:40],
            "s03kv": "sk-sl-bench-" + hashlib.sha256(b"sluice-bench-s03kv").hexdigest()[:40]}
S03_MESSAGES = [
    {"role": "system", "content": "You are the support assistant of a bench company. " * 30
     + "Answer briefly and cite the ticket."},
    {"role": "user", "content": "Ticket 5521: the invoice total is wrong, what do I do?"}]
S03_BODY = json.dumps({"model": "tier-p", "messages": S03_MESSAGES, "max_tokens": 8}).encode()


def _s03_new_turn_body(n: int) -> bytes:
    """--s03-new-turns: the S03 system prompt, then a question no earlier request asked."""
    messages = [S03_MESSAGES[0], {"role": "user", "content": (
        f"Ticket {n}: the invoice total is off by {n % 997} euros since the last "
        f"update, what do I do?")}]
    return json.dumps({"model": "tier-p", "messages": messages, "max_tokens": 8}).encode()
BODY = json.dumps({"model": "tier-1", "messages": [
    {"role": "system", "content": "You are a benchmark."},
    {"role": "user", "content": "Say hello."}], "max_tokens": 8}).encode()
_RESPONSE = json.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 1700000000,
    "model": "tiny", "choices": [{"index": 0, "message": {"role": "assistant",
                                                         "content": "Hello there!"},
                                  "logprobs": None, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15,
              "prompt_tokens_details": {"cached_tokens": 8}}}).encode()


async def upstream_app(scope, receive, send):
    """The fast upstream: a fixed chat completion, no framework."""
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(_RESPONSE)).encode())]})
    await send({"type": "http.response.body", "body": _RESPONSE})


# ---------------------------------------------------------------- load generator process

def _request(host: str, port: str, path: str, body: bytes, key: str = KEY) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def _nonce_body(n: int) -> bytes:
    """A cacheable request (temperature 0) that no earlier one matches."""
    return json.dumps({"model": "tier-1", "temperature": 0, "max_tokens": 8, "messages": [
        {"role": "system", "content": "You are a benchmark."},
        {"role": "user", "content": f"Say hello to customer {n}."}]}).encode()


_WORDS = ("red", "blue", "green", "quiet", "loud", "happy", "tired", "young", "old", "tall",
          "short", "brave", "calm", "eager", "gentle", "kind", "lively", "proud", "silly", "witty",
          "busy", "clever", "curious", "friendly", "funny", "honest", "jolly", "lucky", "polite",
          "shy", "smart", "strong", "sweet", "warm", "wise", "bold", "cheerful", "patient",
          "humble", "careful")


def _shared_body(n: int) -> bytes:
    """A cacheable, entity-free request no earlier one matches; all share one bucket."""
    k = len(_WORDS)
    words = " ".join(_WORDS[(n // k ** i) % k] for i in range(3))
    return json.dumps({"model": "tier-1", "temperature": 0, "max_tokens": 8, "messages": [
        {"role": "system", "content": "You are a benchmark."},
        {"role": "user", "content": f"Say hello to the {words} customer."}]}).encode()


async def _one_conn(host: str, port: int, make_request, stop_at: float, warm_until: float,
                    lat: list[float], errors: list[int], warm_count: list[int],
                    interval: float = 0.0, first_at: float = 0.0) -> None:
    """Closed loop (``interval`` 0): back to back. Open loop: one request every
    ``interval`` s from ``first_at``; latency counts from when it was due, so a late start
    (the server fell behind) is not hidden."""
    reader, writer = await asyncio.open_connection(host, port)
    due = first_at
    try:
        while True:
            request = make_request()
            if interval:
                now = time.perf_counter()
                if due > now:
                    await asyncio.sleep(due - now)
                t0, due = due, due + interval
            else:
                t0 = time.perf_counter()
            if t0 >= stop_at:
                return
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            lower = head.lower()
            i = lower.find(b"content-length:")
            if i >= 0:
                n = int(lower[i + 15:lower.index(b"\r\n", i)])
                await reader.readexactly(n)
            else:  # chunked
                while True:
                    size = int((await reader.readuntil(b"\r\n")).strip(), 16)
                    await reader.readexactly(size + 2)
                    if size == 0:
                        break
            t1 = time.perf_counter()
            if status != 200:
                errors.append(status)
            elif t0 >= warm_until:
                lat.append(t1 - t0)
            else:
                warm_count[0] += 1
    finally:
        writer.close()


async def _loadgen(url: str, path: str, conc: int, seconds: float, warm: float,
                   mode: str = "plain", rate: float = 0.0) -> dict:
    host, port = url.split("//")[1].split(":")
    if mode in ("nonce", "shared"):
        counter = iter(range(10**12))
        base = uuid.uuid4().int % 10**6 * 10**6  # unique across runs of one gateway
        make_body = _nonce_body if mode == "nonce" else _shared_body

        def make_request() -> bytes:
            return _request(host, port, path, make_body(base + next(counter)))
    elif mode in ("s03new", "s03kvnew"):
        counter = iter(range(10**12))
        base = uuid.uuid4().int % 10**6 * 10**6
        key = S03_KEYS[mode[:-3]]

        def make_request() -> bytes:
            return _request(host, port, path, _s03_new_turn_body(base + next(counter)), key)
    else:
        fixed = (_request(host, port, path, S03_BODY, S03_KEYS[mode]) if mode in S03_KEYS
                 else _request(host, port, path, BODY))

        def make_request() -> bytes:
            return fixed
    lat: list[float] = []
    errors: list[int] = []
    warm_count = [0]
    start = time.perf_counter()
    warm_until, stop_at = start + warm, start + warm + seconds
    interval = conc / rate if rate else 0.0
    results = await asyncio.gather(*[_one_conn(host, int(port), make_request, stop_at, warm_until,
                                               lat, errors, warm_count, interval,
                                               start + 0.2 + interval * i / conc)
                                     for i in range(conc)],
                                   return_exceptions=True)
    exc = [repr(r) for r in results if isinstance(r, BaseException)]
    warm_n = warm_count[0]
    lat.sort()
    n = len(lat)
    return {"n": n, "warm_n": warm_n, "rps": n / seconds, "errors": len(errors) + len(exc),
            "error_sample": (exc or [str(e) for e in errors[:3]])[:3],
            "p50_ms": lat[n // 2] * 1000 if n else None,
            "p99_ms": lat[min(n - 1, int(n * 0.99))] * 1000 if n else None}


# ---------------------------------------------------------------- orchestration

def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_http(url: str, timeout: float = 60.0, headers: dict | None = None,
              body: bytes = BODY) -> None:
    import httpx
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            r = httpx.post(url, content=body, headers={"authorization": f"Bearer {KEY}",
                                                       "content-type": "application/json",
                                                       **(headers or {})}, timeout=5)
            if r.status_code == 200:
                return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not come up")


def snapshot(upstream: str) -> dict:
    from app.contract.policy import DEFAULTS
    tier = {"id": 1, "name": "tier-1", "rank": 1, "model": "tiny", "price_input_per_m": "0.06",
            "price_cached_input_per_m": "0.015", "price_output_per_m": "0.18",
            "upstream_kind": "external", "pool_id": None, "endpoint_url": upstream + "/v1",
            "api_key_env": "", "timeout_s": 30.0, "enabled": True}
    # A frontier tier the bench never calls: tier-1 must not be the top rank, or every
    # cacheable miss (its answer is parsed) would also be captured as a LoRA trace, the
    # flywheel's cost rather than the cache's.
    frontier = {**tier, "id": 3, "name": "tier-3", "rank": 3, "model": "frontier"}
    # --s03: a pool tier of 4 replicas (the same upstream) and two tenants on it
    pool_tier = {**tier, "id": 2, "name": "tier-p", "rank": 2, "upstream_kind": "pool",
                 "pool_id": 7, "endpoint_url": ""}
    pool = {"id": 7, "name": "bench-pool", "served_model_name": "bench", "engine": "reference",
            "model": "smollm2", "replicas": [{"id": 70 + i, "name": f"r{i}", "url": upstream,
                                              "state": "healthy", "weight": 1.0}
                                             for i in range(4)]}
    tenants = {"1": {"id": 1, "name": "bench", "department": "bench", "status": "active",
                     "policy": dict(DEFAULTS)}}
    keys = {hashlib.sha256(KEY.encode()).hexdigest():
            {"id": 1, "tenant_id": 1, "prefix": KEY[:12], "expires_at": None}}
    for tid, (mode, choice) in ((2, ("s03", "sluice")), (3, ("s03kv", "kv_events"))):
        tenants[str(tid)] = {"id": tid, "name": mode, "department": "bench", "status": "active",
                             "policy": {**DEFAULTS, "replica_choice": choice,
                                        "cache_salt": False}}
        keys[hashlib.sha256(S03_KEYS[mode].encode()).hexdigest()] = {
            "id": tid, "tenant_id": tid, "prefix": S03_KEYS[mode][:12], "expires_at": None}
    return {"version": 1, "tiers": [tier, pool_tier, frontier], "pools": {"7": pool},
            "workflows": {}, "tenants": tenants, "keys": keys,
            "global_policy": dict(DEFAULTS)}


def keep_kv_index_fresh(r, ns: str, stop) -> None:
    """The subscriber's part for --s03: replica 70 holds the prompt's blocks, all four
    replicas' index entries stay fresh."""
    from app.contract import kv_index
    from app.contract.keys import Keys
    from app.contract.tokenizers import chat_tokenizer
    from app.gateway.kv_route import PromptTokens, request_chain
    keys = Keys(ns)
    chain, _ = request_chain(PromptTokens(chat_tokenizer("smollm2")),
                             {"messages": S03_MESSAGES}, None, "")
    kv_index.apply_events(r, keys, 70, [("BlockStored", chain)], seq=0)
    while not stop.wait(1.0):
        kv_index.heartbeat(r, keys, [70, 71, 72, 73])


def run_load(url: str, path: str, conc: int, seconds: float, warm: float,
             mode: str = "plain", rate: float = 0.0) -> dict:
    out = subprocess.run([sys.executable, __file__, "--loadgen", url, path, str(conc),
                          str(seconds), str(warm), mode, str(rate)], capture_output=True, text=True,
                         timeout=seconds + warm + 60)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout)


def settle(pid: int, window: float = 0.3, limit: float = 10.0, idle_share: float = 0.0
           ) -> None:
    """Wait until the gateway's process tree is idle (at most one clock tick of CPU in
    ``window``, or ``idle_share`` of it where that is more), so what a cell leaves running (its ledger batches, the cyclic GC of its
    garbage) is not counted in the next one. Cells run in a fixed order reversed every
    other round, so without this the cell after the fastest one (the plain ``sluice``
    row, ~1,600 req/s) would pay for it: s03-kv in every even round, a bias against one
    side of the pair, the larger the shorter the cells."""
    tick = 1.0 / os.sysconf("SC_CLK_TCK")
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        cpu0 = tree_cpu_s(pid)
        time.sleep(window)
        if tree_cpu_s(pid) - cpu0 <= max(tick * 1.5, idle_share * window):
            return


def tree_tasks(pid: int):
    """(pid, its thread directories under /proc) for a process and each of its
    descendants (Linux /proc); one that ends meanwhile is left out."""
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = list(Path(f"/proc/{p}/task").iterdir())
            for task in tasks:
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
        yield p, tasks


def tree_cpu_s(pid: int) -> float:
    """User+system CPU seconds of a process and its children (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for p, _ in tree_tasks(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def tree_wakeups(pid: int) -> int:
    """Voluntary context switches of a process tree's threads (Linux /proc): each is a
    thread going to sleep, for the gateway mostly its event loop finding nothing ready."""
    total = 0
    for _, tasks in tree_tasks(pid):
        for task in tasks:
            try:
                status = (task / "status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    total += int(line.split()[1])
    return total


def local_redis_pid(r) -> int | None:
    """The Redis server's pid when it runs on this machine (its CPU a request is then read
    from /proc like the gateway's), else None."""
    try:
        pid = int(r.info("server")["process_id"])
    except Exception:  # noqa: BLE001 - no INFO (a proxy), no figure
        return None
    return pid if Path(f"/proc/{pid}/stat").exists() else None


def print_table(results: dict[int, dict[str, dict]]) -> None:
    print(f"{'conc':>5} {'target':>10} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} "
          f"{'+p50 ms':>8} {'+p99 ms':>8} {'cpu us/req':>10} {'errors':>6}")
    for conc, row in results.items():
        base = row["direct"]
        for name, res in row.items():
            add50 = add99 = ""
            if name != "direct" and res["p50_ms"] is not None:
                add50 = f"{res['p50_ms'] - base['p50_ms']:.2f}"
                add99 = f"{res['p99_ms'] - base['p99_ms']:.2f}"
            p50 = f"{res['p50_ms']:.2f}" if res["p50_ms"] is not None else "-"
            p99 = f"{res['p99_ms']:.2f}" if res["p99_ms"] is not None else "-"
            print(f"{conc:>5} {name:>10} {p50:>8} {p99:>8} {res['rps']:>8.0f} "
                  f"{add50:>8} {add99:>8} {res['cpu_us']:>10.0f} {res['errors']:>6}")
            if res["errors"]:
                print(f"      {name} error sample: {res['error_sample']}")


def median_cell(runs: list[dict]) -> dict:
    """One target's cell over rounds: the median of each figure, every round's p50 kept."""
    import statistics
    rounds = {"rounds_p50": [r["p50_ms"] for r in runs], "rounds_rps": [r["rps"] for r in runs],
              "rounds_cpu": [r["cpu_us"] for r in runs],
              "rounds_redis": [r.get("redis_us") for r in runs],
              "rounds_wakeups": [r.get("wakeups") for r in runs]}
    if len(runs) == 1:
        return {**runs[0], **rounds}
    out = dict(runs[-1])
    for k in ("p50_ms", "p99_ms", "rps", "cpu_us"):
        vals = [r[k] for r in runs if r[k] is not None]
        out[k] = statistics.median(vals) if vals else None
    out["errors"] = sum(r["errors"] for r in runs)
    out.update(rounds)
    return out


def print_pairs(results: dict[int, dict[str, dict]], closed: bool = True) -> None:
    """--s03: s03-kv minus s03-sluice per round (the two ran back to back each round): p50;
    the mean latency by Little's law (a closed loop of N connections: N / req/s, every
    request's latency in it, not the one at the median; closed loops only); the gateway's
    CPU a request; the Redis server's CPU a request (when it runs on this machine: the
    kv_events route script does more there than the loads script it replaces); the
    gateway's wakeups a request (its threads going to sleep: the event loop finding nothing
    ready, which a slower reply from Redis can make more frequent)."""
    import statistics

    def line(what: str, diffs: list[float], unit: str, fmt: str) -> None:
        if diffs:
            print(f"{what} per round ({unit}): " + " ".join(format(d, fmt) for d in diffs)
                  + f"; median {format(statistics.median(diffs), fmt)}")
    for conc, row in results.items():
        for kv, sl in (("s03-kv", "s03-sluice"), ("s03n-kv", "s03n-sluice")):
            if kv not in row or sl not in row:
                continue
            a, b = row[kv], row[sl]
            line(f"conc {conc}: {kv} minus {sl} p50",
                 [x - y for x, y in zip(a["rounds_p50"], b["rounds_p50"])
                  if x is not None and y is not None], "ms", "+.2f")
            if closed:
                line(f"conc {conc}: {kv} minus {sl} mean latency (conc / req/s)",
                     [1000.0 * conc * (1.0 / x - 1.0 / y)
                      for x, y in zip(a["rounds_rps"], b["rounds_rps"]) if x and y],
                     "ms", "+.2f")
            line(f"conc {conc}: {kv} minus {sl} gateway CPU a request",
                 [x - y for x, y in zip(a["rounds_cpu"], b["rounds_cpu"])
                  if x is not None and y is not None], "us", "+.0f")
            line(f"conc {conc}: {kv} minus {sl} Redis CPU a request",
                 [x - y for x, y in zip(a["rounds_redis"], b["rounds_redis"])
                  if x is not None and y is not None], "us", "+.1f")
            line(f"conc {conc}: {kv} minus {sl} gateway wakeups a request",
                 [x - y for x, y in zip(a["rounds_wakeups"], b["rounds_wakeups"])
                  if x is not None and y is not None], "", "+.3f")


def teardown(procs: list[subprocess.Popen], r, ns: str) -> None:
    """Stop the bench's processes (TERM, then KILL after 15 s) and drop its Redis keys."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
    for key in r.scan_iter(f"{ns}:*"):
        r.delete(key)


def start(cmd: list[str], env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(log, "w"),
                            stderr=subprocess.STDOUT)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--warm", type=float, default=1.0)
    ap.add_argument("--levels", default="1,32,256")
    ap.add_argument("--gateway-workers", type=int, default=1)
    ap.add_argument("--open-rate", type=float, default=0.0,
                    help="also run each level open loop at this many req/s in total")
    ap.add_argument("--cacheable", action="store_true",
                    help="also time temperature-0 requests that pay S00 (all misses)")
    ap.add_argument("--s03", action="store_true",
                    help="also time S03's choice on a 4-replica pool: sluice vs kv_events")
    ap.add_argument("--s03-new-turns", action="store_true",
                    help="with --s03: also the pair with a new user question per request")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every target this many times per level, alternating the order; "
                         "print the medians and, for --s03, each round's s03-kv minus "
                         "s03-sluice (the two rows' difference moves with the box between "
                         "cells more than it does between policies)")
    ap.add_argument("--litellm", default=os.environ.get("SLUICE_BENCH_LITELLM",
                                                        "/tmp/litellm-venv"))
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    import redis
    redis_url = os.environ.get("SLUICE_REDIS_URL", "redis://127.0.0.1:6379/0")
    ns = f"sluicebench{uuid.uuid4().hex[:8]}"
    tmp = Path(tempfile.mkdtemp(prefix="sluice-bench-"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "SLUICE_REDIS_URL": redis_url, "SLUICE_REDIS_NAMESPACE": ns, "SLUICE_ENV": "dev",
           "SLUICE_GATEWAY_LEDGER_SPOOL_DIR": str(tmp / "spool"),
           "SLUICE_QDRANT_PATH": str(tmp / "qdrant"), "SLUICE_GATEWAY_CACHE_WARM": "1",
           "PYTHONPATH": str(ROOT)}
    procs: list[subprocess.Popen] = []
    r = redis.Redis.from_url(redis_url)
    redis_pid = local_redis_pid(r)
    try:
        up_port, gw_port = free_port(), free_port()
        upstream = f"http://127.0.0.1:{up_port}"
        procs.append(start([sys.executable, "-m", "uvicorn", "--app-dir", str(ROOT / "bench"),
                            "gateway_overhead:upstream_app", "--host", "127.0.0.1", "--port",
                            str(up_port), "--log-level", "warning", "--no-access-log"],
                           env, tmp / "upstream.log"))
        snap = snapshot(upstream)
        r.set(f"{ns}:snapshot:data", json.dumps(snap))
        r.set(f"{ns}:snapshot:version", 1)
        gunicorn = str(Path(sys.executable).with_name("gunicorn"))
        procs.append(start([gunicorn, "-k", "uvicorn.workers.UvicornWorker",
                            "-w", str(args.gateway_workers),
                            "-b", f"127.0.0.1:{gw_port}", "--log-level", "warning",
                            "app.gateway.asgi:create_gateway()"], env, tmp / "gateway.log"))
        targets = {"direct": (upstream, "/v1/chat/completions"),
                   "sluice": (f"http://127.0.0.1:{gw_port}", "/v1/chat/completions")}
        wait_http(upstream + "/v1/chat/completions")
        wait_http(targets["sluice"][0] + "/v1/chat/completions")
        if args.cacheable:
            targets["sluice+s00"] = targets["sluice"]
            targets["s00-shared"] = targets["sluice"]
            # the embedding model loads in the background at start: wait until a
            # cacheable request is served in embedding time, not loading time
            for i in range(200):  # shared-bucket requests: from the second on, they embed
                t0 = time.perf_counter()
                wait_http(targets["sluice"][0] + "/v1/chat/completions", body=_shared_body(i))
                if i and time.perf_counter() - t0 < 0.2:
                    break
        if args.s03:
            import threading
            stop_index = threading.Event()
            threading.Thread(target=keep_kv_index_fresh, args=(r, ns, stop_index),
                             daemon=True).start()
            targets["s03-kv"] = targets["sluice"]
            targets["s03-sluice"] = targets["sluice"]
            if args.s03_new_turns:
                targets["s03n-kv"] = targets["sluice"]
                targets["s03n-sluice"] = targets["sluice"]
            # the gateway loads SmolLM2's tokenizer on its first kv_events request: wait
            # until one is served in routing time, not loading time
            host, port = targets["sluice"][0].split("//")[1].split(":")
            for _ in range(300):
                t0 = time.perf_counter()
                with socket.create_connection((host, int(port))) as conn:
                    conn.sendall(_request(host, port, "/v1/chat/completions", S03_BODY,
                                          S03_KEYS["s03kv"]))
                    conn.recv(65536)
                if time.perf_counter() - t0 < 0.05:
                    break
                time.sleep(0.2)
        # the gateway's start-up warm-ups (grammar compiler) run in threads: let them finish,
        # so the first rows do not share the CPU with them
        for _ in range(60):
            cpu0 = tree_cpu_s(procs[1].pid)
            time.sleep(1.0)
            if tree_cpu_s(procs[1].pid) - cpu0 < 0.05:
                break
        litellm_bin = Path(args.litellm) / "bin" / "litellm"
        litellm_note = ""
        if litellm_bin.exists():
            ll_port = free_port()
            cfg = tmp / "litellm.yaml"
            cfg.write_text(json.dumps({
                "model_list": [{"model_name": "tier-1", "litellm_params": {
                    "model": "openai/tiny", "api_base": upstream + "/v1", "api_key": "sk-x"}}],
                "litellm_settings": {"drop_params": True, "telemetry": False,
                                     "set_verbose": False},
                "general_settings": {"master_key": KEY}}))
            ll_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
            ll_env.update(LITELLM_LOG="ERROR", LITELLM_TELEMETRY="False",
                          LITELLM_LOCAL_MODEL_COST_MAP="True")
            procs.append(start([str(litellm_bin), "--config", str(cfg), "--host", "127.0.0.1",
                                "--port", str(ll_port), "--num_workers", "1"], ll_env,
                               tmp / "litellm.log"))
            try:
                wait_http(f"http://127.0.0.1:{ll_port}/v1/chat/completions", timeout=90)
                targets["litellm"] = (f"http://127.0.0.1:{ll_port}", "/v1/chat/completions")
            except RuntimeError:
                litellm_note = f"LiteLLM proxy did not start (log: {tmp / 'litellm.log'})"
        else:
            litellm_note = (f"LiteLLM unavailable: no {litellm_bin} (python3 -m venv "
                            "/tmp/litellm-venv && /tmp/litellm-venv/bin/pip install "
                            "'litellm[proxy]')")
        # CPU the proxy itself burns per request: a figure other load on the box cannot skew
        owners = {"direct": procs[0].pid, "sluice": procs[1].pid,
                  "sluice+s00": procs[1].pid, "s00-shared": procs[1].pid,
                  "s03-sluice": procs[1].pid, "s03-kv": procs[1].pid,
                  "s03n-sluice": procs[1].pid, "s03n-kv": procs[1].pid}
        modes = {"sluice+s00": "nonce", "s00-shared": "shared", "s03-sluice": "s03",
                 "s03-kv": "s03kv", "s03n-sluice": "s03new", "s03n-kv": "s03kvnew"}
        if "litellm" in targets:
            owners["litellm"] = procs[2].pid
        def measure(rate: float) -> dict[int, dict[str, dict]]:
            results: dict[int, dict[str, dict]] = {}
            for conc in levels:
                cells: dict[str, list[dict]] = {name: [] for name in targets}
                for rnd in range(args.rounds):
                    # every other round in reverse: no target always runs after the same one
                    order = list(targets) if rnd % 2 == 0 else list(targets)[::-1]
                    for name in order:
                        url, path = targets[name]
                        settle(procs[1].pid)
                        cpu0 = tree_cpu_s(owners[name])
                        redis0 = tree_cpu_s(redis_pid) if redis_pid else None
                        wake0 = tree_wakeups(owners[name])
                        res = run_load(url, path, conc, args.seconds, args.warm,
                                       modes.get(name, "plain"), rate)
                        total = max(res["n"] + res.get("warm_n", 0), 1)
                        res["cpu_us"] = (tree_cpu_s(owners[name]) - cpu0) / total * 1e6
                        res["wakeups"] = (tree_wakeups(owners[name]) - wake0) / total
                        res["redis_us"] = ((tree_cpu_s(redis_pid) - redis0) / total * 1e6
                                           if redis_pid else None)
                        cells[name].append(res)
                results[conc] = {name: median_cell(runs) for name, runs in cells.items()}
            return results

        runs = [("closed loop: each connection sends its next request when the last "
                 "answer arrived", measure(0.0))]
        if args.open_rate:
            runs.append((f"open loop: {args.open_rate:g} req/s offered in total, spread over "
                         "the connections; latency from when each request was due",
                         measure(args.open_rate)))
        print(f"gateway overhead, non-streaming chat completions, {args.seconds:g}s per cell, "
              f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
              f"{args.gateway_workers} gateway worker(s)")
        for i, (title, results) in enumerate(runs):
            print(f"\n{title}" + (f"; each cell the median of {args.rounds} rounds, run in "
                                  "alternating order" if args.rounds > 1 else ""))
            print_table(results)
            print_pairs(results, closed=i == 0)
        if litellm_note:
            print(litellm_note)
    finally:
        teardown(procs, r, ns)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--loadgen":
        url, path, conc, secs, warm, mode, rate = sys.argv[2:9]
        print(json.dumps(asyncio.run(_loadgen(url, path, int(conc), float(secs), float(warm),
                                              mode, float(rate)))))
    else:
        sys.path.insert(0, str(ROOT))
        main()
