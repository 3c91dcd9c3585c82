"""Instructions the gateway's CPU executes per request for S03 (the replica choice, the
in-flight acquire and the release), today's policy (``sluice``) against ``kv_events``,
counted by valgrind's callgrind: a count, not a time, so it does not move with a shared
box's noise (bench/gateway_overhead.py's 32-connection rows moved by up to 7 ms a round on
the 2-core boxes, the effect looked for being about 1 ms).

    .venv/bin/python bench/s03_instructions.py [--requests 300] [--new-turns] [--repeat 2]

Needs valgrind (Debian: ``apt-get install valgrind``); about a minute per policy and run.

Per policy a child process runs under ``valgrind --tool=callgrind --instr-atstart=no``: the
real ``app.gateway.stages.s03_prefill.run`` and the gateway's own ``track_replica`` /
``untrack_replica`` on a 4-replica pool (bench/gateway_overhead.py's snapshot and ~600-token
prompt, the KV index kept fresh with one replica holding the prompt's blocks as there),
with 32 concurrent requests through the gateway's asyncio Redis client against the real
Redis ($SLUICE_REDIS_URL). Both policies are run once unmeasured first, so tokenizer, caches
and script loads are warm; instrumentation is switched on (``callgrind_control -i on``) for
``--requests`` requests of one policy and off after them. ``--new-turns``: each request a
new user question after the same system prompt (bench/gateway_overhead.py's s03n rows),
parsed from JSON per request as the gateway does.

The count covers the gateway process only (Redis's own work is in Redis). It depends on
how replies interleave with the 32 requests (an event-loop turn that finds fewer replies
ready costs more a request), so it is steady on a quiet box (0.2% between runs) and not
beside other load (one run beside the test suite counted kv_events +109k over sluice,
the next, quiet, +57k): run it alone; ``--repeat`` alternates the policies. At 32
connections the bench's gateway is CPU-bound, so its p50 is about 32 x its CPU a request:
instructions a request x 32 / (instructions per us) is what a difference here costs there.

``--gateway`` counts the whole gateway instead: the real server process (uvicorn running
``app.gateway.asgi:create_gateway``, as gunicorn's worker does) under callgrind, with its
config the production way (a snapshot in Redis), sent ``--requests`` chat completions per
phase over HTTP by 32 connections from this process, to the bench's fast upstream
(bench/gateway_overhead.py's). Every stage counts: HTTP parsing, auth, S00-S05, the
upstream call, the ledger spool. One process measures the policies alternately
(``--repeat`` pairs) after a warm-up of each. Its background tasks (snapshot poll, in-flight
refresh) run in every phase too. At 32 connections bench/gateway_overhead.py's gateway
is CPU-bound, so its p50 is ~32 x its CPU a request: the share a policy adds here is about
the share it adds to that p50.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CONC = 32


def child(policy: str, n: int, new_turns: bool, signals: Path) -> None:
    import redis as redis_lib

    from app.contract import aredis, heap
    from app.contract.inflight import AsyncInflightTracker
    from app.contract.keys import Keys
    from app.contract.snapshot import Snapshot
    from app.gateway import kv_route
    from app.gateway.asgi import Gateway
    from app.gateway.context import RequestContext
    from app.gateway.stages import s03_prefill
    from bench import gateway_overhead as go

    url = os.environ.get("SLUICE_REDIS_URL", "redis://127.0.0.1:6379/0")
    ns = "bench-s03i-" + uuid.uuid4().hex[:8]
    sync = redis_lib.Redis.from_url(url)
    keys = Keys(ns)
    snap = Snapshot(go.snapshot("http://127.0.0.1:9"))
    while kv_route.prompt_tokens("smollm2") is None:     # loads in a thread
        time.sleep(0.2)
    stop = threading.Event()
    threading.Thread(target=go.keep_kv_index_fresh, args=(sync, ns, stop), daemon=True).start()
    time.sleep(1.5)

    class Services:                   # what S03 and the gateway's tracking use, no more
        config = {"CACHE_SALT_SECRET": "bench", "SECRET_KEY": "bench"}
        upstream = None
        track_replica = Gateway.track_replica
        untrack_replica = Gateway.untrack_replica

        def __init__(self, client) -> None:
            self.redis, self.keys = client, keys
            self.inflight = AsyncInflightTracker(client, keys)

    tier = next(t for t in snap.allowed_tiers(snap.tenant(2)) if t["name"] == "tier-p")
    tenants = {"sluice": snap.tenant(2), "kv_events": snap.tenant(3)}

    def body(i: int) -> dict:
        if new_turns:
            return json.loads(go._s03_new_turn_body(i))
        return json.loads(go.S03_BODY)

    async def one(services, tenant, i: int) -> None:
        ctx = RequestContext(request_id=str(i), snapshot=snap, tenant=tenant, key={},
                             body=body(i), services=services)
        ctx.tier = tier
        await s03_prefill.run(ctx)
        await services.track_replica(ctx, ctx.replica["id"])
        await services.untrack_replica(ctx)

    async def run(services, tenant, base: int, count: int) -> None:
        todo = iter(range(base, base + count))

        async def worker() -> None:
            for i in todo:
                await one(services, tenant, i)
        await asyncio.gather(*(worker() for _ in range(CONC)))

    async def main() -> None:
        client = aredis.from_url(url, socket_timeout=1.0)
        services = Services(client)
        await run(services, tenants["sluice"], 0, n)
        await run(services, tenants["kv_events"], 10**6, n)
        heap.settle("bench warm-up")
        await run(services, tenants[policy], 2 * 10**6, n)
        print("READY", flush=True)
        while not (signals / "go").exists():
            time.sleep(0.05)
        await run(services, tenants[policy], 3 * 10**6, n)
        print("DONE", flush=True)
        while not (signals / "stop").exists():
            time.sleep(0.05)
        await client.aclose()

    try:
        asyncio.run(main())
    finally:
        stop.set()
        for k in sync.scan_iter(ns + ":*"):
            sync.delete(k)


def measure(policy: str, n: int, new_turns: bool) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        signals = Path(tmp)
        log = signals / "child.log"
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false"}
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
               f"--callgrind-out-file={tmp}/callgrind.out", sys.executable, __file__,
               "--child", policy, "--requests", str(n), "--signals", tmp]
        if new_turns:
            cmd.append("--new-turns")
        with open(log, "w") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                    env=env)

        def wait_for(word: str) -> None:
            while word not in log.read_text():
                if proc.poll() is not None:
                    raise SystemExit(f"{policy} child died:\n{log.read_text()[-3000:]}")
                time.sleep(0.5)
        try:
            wait_for("READY")
            subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], check=True,
                           capture_output=True)
            (signals / "go").touch()
            wait_for("DONE")
            subprocess.run(["callgrind_control", "-i", "off", str(proc.pid)], check=True,
                           capture_output=True)
            (signals / "stop").touch()
            proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
        got = re.findall(r"Collected : (\d+)", log.read_text())
        if not got:
            raise SystemExit(f"no count from callgrind:\n{log.read_text()[-3000:]}")
        return int(got[-1])


def gateway_server(n: int, new_turns: bool, repeat: int, keep: str | None = None,
                   cache_sim: bool = False) -> list[tuple[str, int]]:
    """``--gateway``: (policy, instructions a request) per measured phase. ``keep``: a folder
    the phases' callgrind dumps are copied to (``callgrind_annotate`` reads them per
    function); ``cache_sim``: callgrind's cache simulation on (its dumps then count L1 and
    last-level misses too)."""
    import glob

    import httpx
    import redis as redis_lib

    from bench import gateway_overhead as go
    url = os.environ.get("SLUICE_REDIS_URL", "redis://127.0.0.1:6379/0")
    ns = "bench-s03g-" + uuid.uuid4().hex[:8]
    r = redis_lib.Redis.from_url(url)
    keys = {"sluice": go.S03_KEYS["s03"], "kv_events": go.S03_KEYS["s03kv"]}
    stop = threading.Event()
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false", "SLUICE_REDIS_URL": url,
               "SLUICE_REDIS_NAMESPACE": ns, "SLUICE_ENV": "dev",
               "SLUICE_GATEWAY_LEDGER_SPOOL_DIR": f"{tmp}/spool",
               "SLUICE_QDRANT_PATH": f"{tmp}/qdrant", "PYTHONPATH": str(ROOT)}
        try:
            up_port, gw_port = go.free_port(), go.free_port()
            procs.append(go.start([sys.executable, "-m", "uvicorn", "--app-dir",
                                   str(ROOT / "bench"), "gateway_overhead:upstream_app",
                                   "--host", "127.0.0.1", "--port", str(up_port),
                                   "--log-level", "warning", "--no-access-log"],
                                  env, Path(tmp) / "upstream.log"))
            snap = go.snapshot(f"http://127.0.0.1:{up_port}")
            r.set(f"{ns}:snapshot:data", json.dumps(snap))
            r.set(f"{ns}:snapshot:version", 1)
            threading.Thread(target=go.keep_kv_index_fresh, args=(r, ns, stop),
                             daemon=True).start()
            log = Path(tmp) / "gateway.log"
            gateway = go.start(["valgrind", "--tool=callgrind", "--instr-atstart=no",
                                *(["--cache-sim=yes"] if cache_sim else []),
                                f"--callgrind-out-file={tmp}/callgrind.out", sys.executable,
                                "-m", "uvicorn", "--factory",
                                "app.gateway.asgi:create_gateway", "--host", "127.0.0.1",
                                "--port", str(gw_port), "--log-level", "warning",
                                "--no-access-log"], env, log)
            procs.append(gateway)
            base = f"http://127.0.0.1:{gw_port}/v1/chat/completions"

            def body(i: int) -> bytes:
                return go._s03_new_turn_body(i) if new_turns else go.S03_BODY

            async def send(policy: str, first: int, count: int) -> None:
                todo = iter(range(first, first + count))
                limits = httpx.Limits(max_connections=CONC, max_keepalive_connections=CONC)
                async with httpx.AsyncClient(limits=limits, timeout=600) as client:
                    async def worker() -> None:
                        for i in todo:
                            got = await client.post(base, content=body(i), headers={
                                "authorization": f"Bearer {keys[policy]}",
                                "content-type": "application/json"})
                            if got.status_code != 200:
                                raise SystemExit(f"{policy}: {got.status_code} {got.text[:300]}")
                    await asyncio.gather(*(worker() for _ in range(CONC)))

            # up (under valgrind the start takes a minute or more), then each policy's
            # tokenizer, caches and script loads warm
            deadline = time.monotonic() + 900
            while True:
                try:
                    asyncio.run(send("kv_events", 0, 1))
                    break
                except (httpx.HTTPError, SystemExit):
                    if gateway.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit(f"gateway did not start:\n{log.read_text()[-3000:]}")
                    time.sleep(2)
            for k in range(2):
                for policy in keys:
                    asyncio.run(send(policy, (1 + k) * 10**6, n))

            out = []
            for k in range(repeat):
                for j, policy in enumerate(keys):
                    # start-up work in threads (grammar compiler warm-ups, ~minutes under
                    # valgrind) would be counted in whichever phase it overlaps: wait it out
                    go.settle(gateway.pid, window=2.0, limit=1200, idle_share=0.045)
                    phase = f"phase{2 * k + j}"
                    subprocess.run(["callgrind_control", "-z", str(gateway.pid)], check=True,
                                   capture_output=True)
                    subprocess.run(["callgrind_control", "-i", "on", str(gateway.pid)],
                                   check=True, capture_output=True)
                    t0 = time.time()
                    asyncio.run(send(policy, (5 + 2 * k + j) * 10**6, n))
                    subprocess.run(["callgrind_control", "-i", "off", str(gateway.pid)],
                                   check=True, capture_output=True)
                    subprocess.run(["callgrind_control", "-d", phase, str(gateway.pid)],
                                   check=True, capture_output=True)
                    dump = None
                    for _ in range(100):
                        dump = next((t for t in map(Path.read_text, map(
                            Path, glob.glob(f"{tmp}/callgrind.out.*")))
                            if f"desc: Trigger: dump {phase}\n" in t), None)
                        if dump and re.search(r"^totals: \d+", dump, re.M):
                            break
                        time.sleep(0.2)
                    total = int(re.search(r"^totals: (\d+)", dump or "", re.M).group(1))
                    out.append((policy, total // n))
                    if keep:
                        Path(keep).mkdir(parents=True, exist_ok=True)
                        (Path(keep) / f"{phase}-{policy}.out").write_text(dump)
                    print(f"{policy:>10}: {total / n:12,.0f} instructions a request, whole "
                          f"gateway ({time.time() - t0:.0f} s under callgrind)", flush=True)
            return out
        finally:
            stop.set()
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
            for k in r.scan_iter(ns + ":*"):
                r.delete(k)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--new-turns", action="store_true")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--gateway", action="store_true",
                    help="count the whole gateway server process, not S03 alone")
    ap.add_argument("--keep", help="--gateway: copy each phase's callgrind dump here")
    ap.add_argument("--cache-sim", action="store_true",
                    help="--gateway: callgrind's cache simulation on (misses per function)")
    ap.add_argument("--child")
    ap.add_argument("--signals")
    args = ap.parse_args()
    if (args.keep or args.cache_sim) and not args.gateway:
        ap.error("--keep and --cache-sim count the whole gateway: add --gateway")
    if args.child:
        child(args.child, args.requests, args.new_turns, Path(args.signals))
        return
    import shutil
    if not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        raise SystemExit("valgrind not found: apt-get install valgrind")
    counts: dict[str, list[float]] = {"sluice": [], "kv_events": []}
    what = "S03"
    if args.gateway:
        what = "the whole gateway"
        for policy, count in gateway_server(args.requests, args.new_turns, args.repeat,
                                              args.keep, args.cache_sim):
            counts[policy].append(count)
    for _ in range(0 if args.gateway else args.repeat):
        for policy in counts:
            t0 = time.time()
            counts[policy].append(measure(policy, args.requests, args.new_turns)
                                  / args.requests)
            print(f"{policy:>10}: {counts[policy][-1]:12,.0f} instructions a request "
                  f"({time.time() - t0:.0f} s under callgrind)", flush=True)
    sl, kv = min(counts["sluice"]), min(counts["kv_events"])
    print(f"kv_events - sluice (fewest of {args.repeat} each): {kv - sl:+,.0f} instructions "
          f"a request ({(kv - sl) / sl:+.2%} of {what}'s {sl:,.0f}); {args.requests} "
          "requests a run, "
          f"{'a new question each' if args.new_turns else 'the same prompt'}, {CONC} at once")


if __name__ == "__main__":
    main()
