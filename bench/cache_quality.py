"""Verified cache quality (issue 22): three caches side by side on the same pairs, the same
MiniLM vectors and the same Redis-backed CacheStore.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/cache_quality.py [--pairs bench/data/cache_devset.jsonl]
        [--before-tree /tmp/sluice-before-22] [--calibration 800]

Rows:
- ``static cosine``: GPTCache-style, one static cosine line (the seed's 0.965), no entity
  guard (every key's entity profile replaced by one constant, through the same store);
- ``signature+threshold (before)``: the cache as it was before issue 22 (its own code, run
  from a git worktree of that commit, ``--before-tree``, with this script): the entity
  signature hash, the word-for-word guard and cosine >= 0.965;
- ``signature+threshold (now)``: today's signature (entities only in the hash) with the
  word-for-word guard at 0.965 (no verifier);
- ``verified``: the verified cache: the word-for-word guard at 0.965, or the verifier at
  or above the tenant's learned line, on verified entries. The tenant's line is learned,
  as in production, from observations (cosine, whether the answers agreed) on calibration
  traffic: pairs from the same generator with another seed (other names, ids, numbers),
  held to the policy's error bound (``cache_error_bound``) at 95%.

Each pair gets its own tenant: ``a`` is stored, ``b`` looked up. Hit rate on pairs that
should hit (``same``), false-hit rate on the rest, and the lookup's p50/p99 (vector given;
the embedding of the question is timed on its own below the table). One run prints all
rows; results go to bench/results/cache_quality.txt when saved by hand.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path

ROOT = Path(os.environ.get("SLUICE_BENCH_ROOT") or Path(__file__).resolve().parents[1])
HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(HERE / "bench" / "data"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

from app.contract.cache.embedding import embed, embed_many  # noqa: E402
from app.contract.cache.keys import build_key  # noqa: E402
from app.contract.cache.store import CacheStore  # noqa: E402
from app.contract.policy import DEFAULTS  # noqa: E402

DEFAULT_PAIRS = HERE / "bench" / "data" / "cache_devset.jsonl"
TH = DEFAULTS["cache_similarity_threshold"]


def _body(text: str) -> dict:
    return {"model": "auto", "temperature": 0, "messages": [{"role": "user", "content": text}]}


def _answer(i: int) -> dict:
    return {"id": f"q-{i}", "object": "chat.completion", "choices": [
        {"index": 0, "finish_reason": "stop",
         "message": {"role": "assistant", "content": f"answer {i}"}}]}


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def run_mode(mode: str, pairs: list[dict], va: np.ndarray, vb: np.ndarray, redis_client,
             line: float | None = None) -> dict:
    """Store every ``a`` under its own tenant, look up every ``b``; per kind: pairs, hits."""
    ns = f"cachequality{uuid.uuid4().hex[:8]}"
    store = CacheStore(redis_client, ns)
    policy = dict(DEFAULTS)
    verification = None
    if mode == "verified":
        from app.contract.cache.store import Verification
        floor = float(DEFAULTS["cache_verify_floor"])
        verification = Verification(line=line, floor=floor)
    const = None
    by_kind: dict[str, dict] = defaultdict(lambda: {"pairs": 0, "hits": 0, "same": False})
    times: list[float] = []
    hit_times: list[float] = []
    hows: dict[str, int] = defaultdict(int)
    try:
        for i, p in enumerate(pairs):
            tenant = f"q{i}"
            ka = build_key(tenant, policy, "auto", _body(p["a"]))
            kb = build_key(tenant, policy, "auto", _body(p["b"]))
            if mode == "static":  # no entity guard: one constant profile for every key
                const = const or ka.profile
                ka, kb = dataclasses.replace(ka, profile=const), dataclasses.replace(kb, profile=const)
            if mode == "verified":
                store.store(ka, va[i], _answer(i), f"q-{i}", ttl_s=600, verified=True)
            else:
                store.store(ka, va[i], _answer(i), f"q-{i}", ttl_s=600)
            t0 = time.perf_counter()
            if verification is not None:
                hit = store.lookup(kb, vb[i], TH, verification=verification)
            else:
                hit = store.lookup(kb, vb[i], TH)
            dt = (time.perf_counter() - t0) * 1000
            times.append(dt)
            k = by_kind[p["kind"]]
            k["pairs"] += 1
            k["same"] = p["same"]
            if hit is not None:
                k["hits"] += 1
                hit_times.append(dt)
                hows[getattr(hit, "how", "fast")] += 1
    finally:
        keys = list(redis_client.scan_iter(match=f"{ns}:*", count=1000))
        for j in range(0, len(keys), 500):
            redis_client.delete(*keys[j:j + 500])
    return {"by_kind": dict(by_kind), "p50": pct(times, 50), "p99": pct(times, 99),
            "hit_p50": pct(hit_times, 50), "hows": dict(hows)}


def calibrate(seed: int, per_kind: int) -> tuple[float, dict]:
    """The tenant's line learned from calibration traffic: every pair the verifier would
    consider (same bucket, judged the same, cosine >= the policy floor) is an observation;
    the fresh answer agrees exactly when the pair is ``same``."""
    from make_cache_devset import build

    from app.core.cache_bound import Evidence
    from app.core.cache_verify import same_question
    from app.core.entities import profiles_compatible
    pairs = build(seed, per_kind)
    ev = Evidence()
    floor = float(DEFAULTS["cache_verify_floor"])
    policy = dict(DEFAULTS)
    judged = []   # pairs the verifier would consider (embedded only these: the rest never are)
    for p in pairs:
        ka = build_key("c", policy, "auto", _body(p["a"]))
        kb = build_key("c", policy, "auto", _body(p["b"]))
        if ka.composite != kb.composite or not kb.semantic:
            continue
        if same_question(kb.text, kb.profile, ka.text, ka.profile)[0] \
                or profiles_compatible(ka.profile, kb.profile):
            judged.append((p, ka, kb))
    va = embed_many([ka.text for _, ka, _ in judged])
    vb = embed_many([kb.text for _, _, kb in judged])
    for (p, ka, kb), a, b in zip(judged, va, vb):
        sim = float(np.dot(a, b))
        if sim < floor:
            continue
        if sim >= TH and profiles_compatible(ka.profile, kb.profile):
            continue  # the word-for-word path: not the verifier's evidence
        if same_question(kb.text, kb.profile, ka.text, ka.profile)[0]:
            ev.add(sim, p["same"])
    bound = float(DEFAULTS["cache_error_bound"])
    line = ev.line(bound, floor, TH)
    n, k, rate, lo, hi = ev.measured(line)
    return line, {"pairs": len(pairs), "observations": sum(ev.n), "wrong": sum(ev.wrong),
                  "bound": bound, "line": line, "at_line": [n, k, rate, lo, hi]}


def summary(res: dict) -> tuple[int, int, int, int]:
    sh = sp = fh = fp = 0
    for k in res["by_kind"].values():
        if k["same"]:
            sh, sp = sh + k["hits"], sp + k["pairs"]
        else:
            fh, fp = fh + k["hits"], fp + k["pairs"]
    return sh, sp, fh, fp


def before_tree(tree: str, pairs_path: str) -> dict | None:
    """The signature+threshold row from the code before issue 22 (its own tree)."""
    env = {**os.environ, "SLUICE_BENCH_ROOT": tree, "PYTHONPATH": tree}
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--pairs", pairs_path,
                          "--only", "signature", "--json"], env=env, cwd=tree,
                         capture_output=True, text=True, timeout=1200)
    if out.returncode != 0:
        print("before-tree run failed:", out.stderr[-2000:], file=sys.stderr)
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", default=str(DEFAULT_PAIRS))
    ap.add_argument("--before-tree", default="")
    ap.add_argument("--calibration", type=int, default=1000, help="calibration pairs per kind")
    ap.add_argument("--calibration-seed", type=int, default=7171)
    ap.add_argument("--line", type=float, default=None,
                    help="the tenant's line as given (skip calibration), e.g. the policy floor")
    ap.add_argument("--only", default="", help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    import redis
    r = redis.Redis.from_url(os.environ.get("SLUICE_REDIS_URL", "redis://127.0.0.1:6379/0"))
    pairs = [json.loads(line) for line in open(args.pairs, encoding="utf-8") if line.strip()]
    va, vb = embed_many([p["a"] for p in pairs]), embed_many([p["b"] for p in pairs])
    if args.only:
        print(json.dumps(run_mode(args.only, pairs, va, vb, r)))
        return
    rows: list[tuple[str, dict]] = []
    print("embedded; running rows", file=sys.stderr, flush=True)
    rows.append((f"static cosine >= {TH} (GPTCache-style)", run_mode("static", pairs, va, vb, r)))
    if args.before_tree:
        before = before_tree(args.before_tree, args.pairs)
        if before is not None:
            rows.append(("signature+threshold (before)", before))
    rows.append(("signature+threshold (now)", run_mode("signature", pairs, va, vb, r)))
    print("calibrating", file=sys.stderr, flush=True)
    if args.line is not None:
        line, cal = args.line, None
    else:
        line, cal = calibrate(args.calibration_seed, args.calibration)
    print(f"line {line}", file=sys.stderr, flush=True)
    rows.append((f"verified (line {line:.2f})", run_mode("verified", pairs, va, vb, r, line)))
    texts = [p["b"] for p in pairs[::13]][:200]
    embed(texts[0])
    emb = []
    for t in texts:
        t0 = time.perf_counter()
        embed(t)
        emb.append((time.perf_counter() - t0) * 1000)

    print(f"cache quality on {args.pairs} ({len(pairs)} pairs), {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'cache':<34} {'paraphrase hits':>17} {'false hits':>14} {'p50 ms':>7} "
          f"{'p99 ms':>7} {'hit p50':>8}")
    for name, res in rows:
        sh, sp, fh, fp = summary(res)
        print(f"{name:<34} {sh:>5}/{sp:<5} {sh / sp:>6.1%} {fh:>4}/{fp:<4} {fh / fp:>5.2%} "
              f"{res['p50']:>7.2f} {res['p99']:>7.2f} {res['hit_p50']:>8.2f}")
    print("\nper kind (hits / pairs):")
    kinds = list(rows[0][1]["by_kind"])
    print(f"{'kind':<14} {'should hit':>10} " + " ".join(f"{n[:22]:>22}" for n, _ in rows))
    for kind in kinds:
        same = rows[0][1]["by_kind"][kind]["same"]
        cells = []
        for _, res in rows:
            k = res["by_kind"].get(kind, {"hits": 0, "pairs": 0})
            cells.append(f"{k['hits']:>4}/{k['pairs']:<4}")
        print(f"{kind:<14} {str(same):>10} " + " ".join(f"{c:>22}" for c in cells))
    ver = rows[-1][1]
    print(f"\nverified row, hits by path: {ver['hows']}")
    if cal is None:
        print(f"tenant line given (--line {line:.2f}): no calibration run; a tenant whose "
              f"evidence has opened the line down to it")
    else:
        n, k, rate, lo, hi = cal["at_line"]
        print(f"tenant line learned from {cal['pairs']} calibration pairs (seed "
              f"{args.calibration_seed}): {cal['observations']} observations, {cal['wrong']} "
              f"wrong; line {line:.2f}: {n} observations at or above it, {k} wrong, error "
              f"{rate:.3%} (95% CI {lo:.3%} - {hi:.3%}), bound {cal['bound']:.3%}")
    print(f"embedding one question (batcher off the path, this process): p50 "
          f"{pct(emb, 50):.2f} ms, p99 {pct(emb, 99):.2f} ms; a verified hit costs the "
          f"embedding plus the lookup: p50 ~ {pct(emb, 50) + ver['hit_p50']:.2f} ms")


if __name__ == "__main__":
    main()
