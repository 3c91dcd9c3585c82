"""What shadowing a LoRA candidate costs the gateway: the same gateway, the same traffic,
the workflow's adapter in shadow at 0% vs 100% of eligible answers, side by side.

    .venv/bin/python bench/shadow_overhead.py [--seconds 5] [--rounds 2]

Real processes, as bench/gateway_overhead.py: a minimal OpenAI-compatible upstream
(uvicorn) that answers every call at once, standing in for both the frontier tier the
client is served by and the tier-1 replica that holds the candidate; the gateway (gunicorn
+ uvicorn worker, 1 worker) configured the production way (a snapshot in Redis); a load
generator of N keep-alive connections sending the workflow's requests (model tier-3, so
every answer is eligible for a shadow run). With 100% sampling each request is sent again
to tier 1 after the client has its answer, judged, and booked as a shadow ledger event.
The rows alternate 0% / 100% ``--rounds`` times so drift on a shared box hits both.
Figures: client p50/p99 latency and req/s, the gateway's own CPU per request, and the
shadow runs it finished per request served (its /metrics: to show they happened)."""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gateway_overhead import free_port, start, teardown, tree_cpu_s, wait_http  # noqa: E402

KEY = "sk-sl-bench-" + hashlib.sha256(b"sluice-shadow-bench").hexdigest()[:40]
WORKFLOW = "bench-invoices"


def snapshot(upstream: str, version: int, sample_pct: float) -> dict:
    from app.contract.policy import DEFAULTS
    policy = {**DEFAULTS, "explore_pct": 0.0, "cache_enabled": False}
    price = {"price_input_per_m": "0.06", "price_cached_input_per_m": "0.015",
             "price_output_per_m": "0.18"}
    tiers = [{"id": 1, "name": "tier-1", "rank": 1, "model": "tiny", **price,
              "upstream_kind": "pool", "pool_id": 1, "endpoint_url": None, "api_key_env": "",
              "timeout_s": 30.0, "enabled": True},
             {"id": 3, "name": "tier-3", "rank": 3, "model": "frontier",
              "price_input_per_m": "3.5", "price_cached_input_per_m": "0.875",
              "price_output_per_m": "10.5", "upstream_kind": "external", "pool_id": None,
              "endpoint_url": upstream + "/v1", "api_key_env": "", "timeout_s": 30.0,
              "enabled": True}]
    return {"version": version, "tiers": tiers, "global_policy": policy,
            "pools": {"1": {"id": 1, "name": "t1", "served_model_name": "tiny",
                            "replicas": [{"id": 11, "name": "t1-0", "url": upstream,
                                          "state": "healthy"}]}},
            "workflows": {f"1:{WORKFLOW}": {"id": 1, "name": "invoices",
                                            "category": "structured_extraction",
                                            "first_seen_at": "2026-01-01T00:00:00+00:00"}},
            "tenants": {"1": {"id": 1, "name": "bench", "department": "bench",
                              "status": "active", "policy": policy}},
            "keys": {hashlib.sha256(KEY.encode()).hexdigest():
                     {"id": 1, "tenant_id": 1, "prefix": KEY[:12], "expires_at": None}},
            "adapters": {f"1:{WORKFLOW}": {
                "name": None, "state": None, "canary_pct": 0, "pool_id": 1,
                "replicas_loaded": [], "previous_name": None, "previous_replicas_loaded": [],
                "shadow": {"name": "lora-cand", "sample_pct": sample_pct, "pool_id": 1,
                           "replicas_loaded": [11]}}}}


async def _load(url: str, conc: int, seconds: float, warm: float) -> dict:
    import httpx
    body = {"model": "tier-3", "max_tokens": 8, "messages": [
        {"role": "system", "content": "Extract the invoice number."},
        {"role": "user", "content": "Invoice INV-2231 from ACME."}]}
    headers = {"authorization": f"Bearer {KEY}", "x-sluice-workflow": WORKFLOW}
    lat: list[float] = []
    errors = 0
    start_at = time.perf_counter()
    warm_until, stop_at = start_at + warm, start_at + warm + seconds
    limits = httpx.Limits(max_connections=conc, max_keepalive_connections=conc)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:
        async def one() -> None:
            nonlocal errors
            while time.perf_counter() < stop_at:
                t0 = time.perf_counter()
                try:
                    r = await client.post("/v1/chat/completions", json=body, headers=headers)
                except httpx.HTTPError:
                    errors += 1
                    continue
                t1 = time.perf_counter()
                if r.status_code != 200:
                    errors += 1
                elif t0 >= warm_until:
                    lat.append(t1 - t0)
        await asyncio.gather(*(one() for _ in range(conc)))
    lat.sort()
    return {"n": len(lat), "errors": errors, "rps": len(lat) / seconds,
            "p50_ms": statistics.median(lat) * 1000 if lat else None,
            "p99_ms": lat[int(0.99 * (len(lat) - 1))] * 1000 if lat else None}


def _metric_sum(gw: str, name: str) -> float:
    import httpx
    text = httpx.get(gw + "/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def shadow_runs(gw: str) -> float:
    """Shadow runs the gateway finished (any outcome), from its own /metrics."""
    return _metric_sum(gw, "sluice_gateway_shadow_runs_total")


def served(gw: str) -> float:
    return _metric_sum(gw, "sluice_gateway_requests_total")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--warm", type=float, default=1.0)
    ap.add_argument("--levels", default="1,16")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    import redis
    from app.contract.keys import Keys
    redis_url = os.environ.get("SLUICE_REDIS_URL", "redis://127.0.0.1:6379/0")
    ns = f"sluicebench{uuid.uuid4().hex[:8]}"
    keys = Keys(ns)
    tmp = Path(tempfile.mkdtemp(prefix="sluice-shadow-bench-"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "SLUICE_REDIS_URL": redis_url, "SLUICE_REDIS_NAMESPACE": ns, "SLUICE_ENV": "dev",
           "SLUICE_GATEWAY_LEDGER_SPOOL_DIR": str(tmp / "spool"),
           "SLUICE_QDRANT_PATH": str(tmp / "qdrant"), "PYTHONPATH": str(ROOT)}
    r = redis.Redis.from_url(redis_url)
    procs: list[subprocess.Popen] = []
    rows: list[tuple[int, float, dict]] = []
    version = 0
    try:
        up_port, gw_port = free_port(), free_port()
        upstream = f"http://127.0.0.1:{up_port}"
        procs.append(start([sys.executable, "-m", "uvicorn", "--app-dir", str(ROOT / "bench"),
                            "gateway_overhead:upstream_app", "--host", "127.0.0.1", "--port",
                            str(up_port), "--log-level", "warning", "--no-access-log"],
                           env, tmp / "upstream.log"))
        gw = f"http://127.0.0.1:{gw_port}"

        def publish(pct: float) -> None:
            nonlocal version
            version += 1
            r.set(keys.snapshot_data(), json.dumps(snapshot(upstream, version, pct)))
            r.set(keys.snapshot_version(), version)
            r.publish(keys.snapshot_changed(), version)

        publish(0.0)
        gunicorn = str(Path(sys.executable).with_name("gunicorn"))
        procs.append(start([gunicorn, "-k", "uvicorn.workers.UvicornWorker", "-w", "1",
                            "-b", f"127.0.0.1:{gw_port}", "--log-level", "warning",
                            "app.gateway.asgi:create_gateway()"], env, tmp / "gateway.log"))
        wait_http(upstream + "/v1/chat/completions")
        wait_http(gw + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"})
        import httpx
        for _ in range(args.rounds):
            for pct in (0.0, 100.0):
                publish(pct)
                for _ in range(100):   # the gateway has this snapshot
                    if httpx.get(gw + "/healthz").json().get("snapshot_version") == version:
                        break
                    time.sleep(0.1)
                for conc in [int(x) for x in args.levels.split(",")]:
                    runs0, served0 = shadow_runs(gw), served(gw)
                    cpu0 = tree_cpu_s(procs[1].pid)
                    res = asyncio.run(_load(gw, conc, args.seconds, args.warm))
                    res["cpu_us"] = (tree_cpu_s(procs[1].pid) - cpu0) / max(res["n"], 1) * 1e6
                    time.sleep(0.5)   # the last shadow runs finish
                    res["shadow_per_req"] = (shadow_runs(gw) - runs0) \
                        / max(served(gw) - served0, 1)
                    rows.append((conc, pct, res))
    finally:
        teardown(procs, r, ns)

    print(__doc__.split("\n\n")[0].strip() + "\n")
    print(f"{args.seconds:g}s per row after {args.warm:g}s warm-up, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}, {args.rounds} rounds alternating\n")
    print(f"{'conc':>5} {'shadow':>7} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} "
          f"{'cpu us/req':>10} {'shadow/req':>10} {'errors':>6}")
    for conc, pct, res in rows:
        print(f"{conc:>5} {pct:>6.0f}% {res['p50_ms']:>8.2f} {res['p99_ms']:>8.2f} "
              f"{res['rps']:>8.0f} {res['cpu_us']:>10.0f} {res['shadow_per_req']:>10.2f} "
              f"{res['errors']:>6}")
    print("\nmedian over rounds, 100% vs 0% (ratio):")
    for conc in sorted({c for c, _, _ in rows}):
        def med(pct: float, key: str) -> float:
            return statistics.median(res[key] for c, p, res in rows if c == conc and p == pct)
        print(f"  conc {conc:>3}: p50 {med(100.0, 'p50_ms'):.2f} vs {med(0.0, 'p50_ms'):.2f} ms "
              f"(x{med(100.0, 'p50_ms') / med(0.0, 'p50_ms'):.2f}); req/s "
              f"{med(100.0, 'rps'):.0f} vs {med(0.0, 'rps'):.0f} "
              f"(x{med(100.0, 'rps') / med(0.0, 'rps'):.2f}); gateway CPU/request "
              f"{med(100.0, 'cpu_us'):.0f} vs {med(0.0, 'cpu_us'):.0f} us "
              f"(x{med(100.0, 'cpu_us') / med(0.0, 'cpu_us'):.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
