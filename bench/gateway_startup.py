"""Gateway process start-up: time and resident memory, this tree vs a baseline revision.

    .venv/bin/python bench/gateway_startup.py [--baseline-rev 106a58f] [--runs 5]

For each tree (the baseline checked out in a temporary git worktree, and this working
tree), interleaved run by run, with the same interpreter and packages:

- import: a fresh ``python -c`` that imports ``app.gateway.asgi`` and builds the app
  (``create_gateway()``): wall time, resident memory after, modules loaded, and whether
  Flask / SQLAlchemy came along;
- serve: a fresh ``uvicorn --factory app.gateway.asgi:create_gateway`` process, timed
  from spawn until ``/healthz`` answers 200 (its snapshot loaded from Redis, a throwaway
  namespace), and its resident memory then (``/proc/<pid>/status`` VmRSS).

Medians are printed side by side with the ratio ours / baseline. No threshold: this is a
measurement, run on a shared machine.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REDIS_URL = os.environ.get("SLUICE_REDIS_URL", "redis://127.0.0.1:6379/0")
KEY = "sk-sl-bench-" + hashlib.sha256(b"sluice-startup").hexdigest()[:40]

IMPORT_PROBE = r"""
import json, sys, time
t0 = time.perf_counter()
from app.gateway.asgi import create_gateway
app = create_gateway()
elapsed = time.perf_counter() - t0
rss = int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1])
print(json.dumps({"s": elapsed, "rss_kb": rss, "modules": len(sys.modules),
                  "flask": "flask" in sys.modules, "sqlalchemy": "sqlalchemy" in sys.modules}))
"""


def snapshot() -> dict:
    policy = {}  # the gateway fills in the defaults (older trees: their own defaults)
    tier = {"id": 1, "name": "tier-1", "rank": 1, "model": "tiny", "price_input_per_m": "0.06",
            "price_cached_input_per_m": "0.015", "price_output_per_m": "0.18",
            "upstream_kind": "external", "pool_id": None,
            "endpoint_url": "http://127.0.0.1:9/v1", "api_key_env": "", "timeout_s": 30.0,
            "enabled": True}
    return {"version": 1, "tiers": [tier], "pools": {}, "workflows": {},
            "tenants": {"1": {"id": 1, "name": "bench", "department": "bench",
                              "status": "active", "policy": policy}},
            "keys": {hashlib.sha256(KEY.encode()).hexdigest():
                     {"id": 1, "tenant_id": 1, "prefix": KEY[:12], "expires_at": None}},
            "global_policy": policy}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_for(ns: str, spool: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.update(SLUICE_REDIS_URL=REDIS_URL, SLUICE_REDIS_NAMESPACE=ns,
               SLUICE_GATEWAY_LEDGER_SPOOL_DIR=spool, HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", PYTHONDONTWRITEBYTECODE="1")
    return env


def import_run(tree: Path, env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", IMPORT_PROBE], cwd=tree, env=env,
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def serve_run(tree: Path, env: dict) -> dict:
    port = free_port()
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "--factory",
                             "app.gateway.asgi:create_gateway", "--port", str(port),
                             "--log-level", "warning"], cwd=tree, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(proc.stderr.read().decode()[-2000:])
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.02)
        else:
            raise RuntimeError("gateway did not become healthy")
        elapsed = time.perf_counter() - t0
        rss = int(next(line for line in open(f"/proc/{proc.pid}/status")
                       if line.startswith("VmRSS")).split()[1])
        return {"s": elapsed, "rss_kb": rss}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline-rev", default="106a58f",
                    help="git revision to compare with (default: main before the contract "
                         "package)")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    import redis
    r = redis.Redis.from_url(REDIS_URL)
    ns = f"sluicebench{uuid.uuid4().hex[:8]}"
    r.set(f"{ns}:snapshot:data", json.dumps(snapshot()))
    r.set(f"{ns}:snapshot:version", 1)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "baseline"
        subprocess.run(["git", "worktree", "add", "--detach", str(base), args.baseline_rev],
                       cwd=ROOT, check=True, capture_output=True)
        try:
            trees = {"baseline": base, "ours": ROOT}
            rows: dict[str, dict[str, list]] = {k: {} for k in trees}
            for i in range(args.runs):
                for name, tree in trees.items():
                    env = env_for(ns, str(Path(tmp) / f"spool-{name}"))
                    imp, srv = import_run(tree, env), serve_run(tree, env)
                    row = rows[name]
                    for k, v in (("import_s", imp["s"]), ("import_rss_kb", imp["rss_kb"]),
                                 ("modules", imp["modules"]), ("serve_s", srv["s"]),
                                 ("serve_rss_kb", srv["rss_kb"])):
                        row.setdefault(k, []).append(v)
                    row["flask"], row["sqlalchemy"] = imp["flask"], imp["sqlalchemy"]
                print(f"run {i + 1}/{args.runs} done", file=sys.stderr)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT,
                           capture_output=True)
            for key in r.scan_iter(f"{ns}:*"):
                r.delete(key)
    med = {n: {k: statistics.median(v) for k, v in row.items() if isinstance(v, list)}
           for n, row in rows.items()}
    print(f"gateway start-up, median of {args.runs} interleaved runs "
          f"(baseline {args.baseline_rev}, ours = working tree)")
    print(f"{'':34}{'baseline':>12}{'ours':>12}{'ours/base':>11}")
    for k, label, scale, unit in (
            ("import_s", "import + create_gateway()", 1000, "ms"),
            ("import_rss_kb", "  resident memory after", 1 / 1024, "MiB"),
            ("modules", "  modules loaded", 1, ""),
            ("serve_s", "spawn -> /healthz 200 (uvicorn)", 1000, "ms"),
            ("serve_rss_kb", "  resident memory then", 1 / 1024, "MiB")):
        b, o = med["baseline"][k] * scale, med["ours"][k] * scale
        print(f"{label:34}{b:>9.1f} {unit:<3}{o:>8.1f} {unit:<3}{o / b:>9.2f}")
    for mod in ("flask", "sqlalchemy"):
        print(f"{mod + ' loaded by the gateway':34}{str(rows['baseline'][mod]):>12}"
              f"{str(rows['ours'][mod]):>12}")


if __name__ == "__main__":
    main()
