"""Verified cache quality (issue 22): three caches side by side on the same pairs, the same
MiniLM vectors and the same Redis-backed CacheStore.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/cache_quality.py [--pairs bench/data/cache_devset.jsonl]
        [--before-tree /tmp/sluice-before-22] [--calibration 800]
    HF_HUB_OFFLINE=1 .venv/bin/python bench/cache_quality.py --learned-line [--learned-pairs 200]
        [--wrong-share 0.05] [--stream 20000] [--entries 500]

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

``--learned-line`` (alone, or after the table when the line was calibrated): how the line
and the per-entry thresholds move under sampled verification. A stream of rewordings that
reach the verifier, at real cosines from calibration pairs (right ones: pairs the verifier
accepts that should hit; wrong ones, a known share ``--wrong-share``: look-alikes that passed
the entity signature, taken as if the verifier had accepted them), each for one of
``--entries`` cached entries: served at or above the entry's threshold (``cache_bound.
entry_threshold``), a ``cache_verify_sample_pct`` share of hits generated again; a miss's
fresh answer compared for free; agreeing adds to the entry's evidence (it goes below the line
only on as many agreements as the bound needs), disagreeing evicts it.
Hit rate and the true error of what was served at the static line (0.965, nothing learned),
then in the first half of the stream and its last quarter, with the measured error (the
evidence at or above the final line, and over all of it, 95% intervals) against the bound,
and where the per-entry thresholds ended.

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
import random
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


def verifier_pool(seed: int, per_kind: int) -> tuple[int, list[tuple[float, bool, bool]]]:
    """Calibration traffic (the dev set's generator, another seed): (pairs, and for every
    pair the verifier would consider, i.e. same bucket, judged the same or entity-compatible,
    cosine >= the policy floor and not on the word-for-word path: (cosine, should hit,
    whether the verifier accepts it))."""
    from make_cache_devset import build

    from app.core.cache_verify import same_question
    from app.core.entities import profiles_compatible
    pairs = build(seed, per_kind)
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
    pool = []
    for (p, ka, kb), a, b in zip(judged, va, vb):
        sim = float(np.dot(a, b))
        if sim < floor:
            continue
        if sim >= TH and profiles_compatible(ka.profile, kb.profile):
            continue  # the word-for-word path: not the verifier's evidence
        pool.append((sim, bool(p["same"]),
                     same_question(kb.text, kb.profile, ka.text, ka.profile)[0]))
    return len(pairs), pool


def calibrate(seed: int, per_kind: int) -> tuple[float, dict]:
    """The tenant's line learned from calibration traffic: every pair the verifier accepts
    is an observation; the fresh answer agrees exactly when the pair is ``same``."""
    from app.core.cache_bound import Evidence
    n_pairs, pool = verifier_pool(seed, per_kind)
    ev = Evidence()
    for sim, same, accepted in pool:
        if accepted:
            ev.add(sim, same)
    floor = float(DEFAULTS["cache_verify_floor"])
    bound = float(DEFAULTS["cache_error_bound"])
    line = ev.line(bound, floor, TH)
    n, k, rate, lo, hi = ev.measured(line)
    return line, {"pairs": n_pairs, "observations": sum(ev.n), "wrong": sum(ev.wrong),
                  "bound": bound, "line": line, "at_line": [n, k, rate, lo, hi], "pool": pool}


def learned_line(pool: list[tuple[float, bool, bool]], wrong_share: float, n: int,
                 entries: int, seed: int = 22) -> dict:
    """The stream described at the top (``--learned-line``), on ``app.core.cache_bound``."""
    from app.core.cache_bound import Evidence, add_agreement, entry_threshold, min_observations
    right = [sim for sim, same, accepted in pool if same and accepted]
    wrong = [sim for sim, same, _ in pool if not same]
    wrong_from = "look-alike calibration pairs"
    if not wrong:
        # none of the look-alikes even reached the verifier (other signature, or judged
        # different): model its mistakes as the worst case, cosines like its right accepts
        wrong, wrong_from = right, ("the right accepts' cosines (no look-alike reached the "
                                    "verifier: worst case, its mistakes look like its accepts)")
    if not right:
        return {"right": len(right), "wrong": 0}
    rng = random.Random(seed)
    bound, floor = float(DEFAULTS["cache_error_bound"]), float(DEFAULTS["cache_verify_floor"])
    sample = float(DEFAULTS["cache_verify_sample_pct"]) / 100.0
    needed = min_observations(bound)
    ev, agreements = Evidence(), {}
    out = {k: [0, 0, 0] for k in ("static", "first half", "last quarter")}  # seen, served, wrong
    sampled = evictions = 0

    def check(entry: int, sim: float, agreed: bool) -> None:
        nonlocal evictions
        ev.add(sim, agreed)
        if agreed:
            agreements[entry] = add_agreement(agreements.get(entry), sim)
        else:   # evicted; the fresh answer takes its place, at the tenant's line
            agreements.pop(entry, None)
            evictions += 1

    for i in range(n):
        bad = rng.random() < wrong_share
        sim, entry = rng.choice(wrong if bad else right), rng.randrange(entries)
        own = entry_threshold(ev.line(bound, floor, TH), agreements.get(entry), floor, needed)
        served = sim >= own
        phases = [("static", sim >= TH)]
        if i < n // 2:
            phases.append(("first half", served))
        if i >= n - n // 4:
            phases.append(("last quarter", served))
        for name, hit in phases:
            out[name][0] += 1
            out[name][1] += hit
            out[name][2] += hit and bad
        if not served:
            check(entry, sim, not bad)   # a miss: its fresh answer is compared for free
        elif rng.random() < sample:
            sampled += 1
            check(entry, sim, not bad)   # generated again off the path
    line = ev.line(bound, floor, TH)
    own = sorted(entry_threshold(line, agreements.get(e), floor, needed) for e in range(entries))
    return {"right": len(right), "wrong": len(wrong), "wrong_from": wrong_from,
            "phases": out, "line": line,
            "measured": ev.measured(line), "measured_all": ev.measured(), "bound": bound, "sampled": sampled,
            "evictions": evictions, "below_line": sum(t < line for t in own),
            "own_p50": own[len(own) // 2], "own_min": own[0], "sample": sample}


def print_learned_line(res: dict, wrong_share: float, n: int, entries: int) -> None:
    print(f"\nlearned line: a stream of {n} verifier candidates over {entries} entries, "
          f"{wrong_share:.1%} wrong (cosines of right ones from {res['right']} verifier-accepted "
          f"calibration pairs, of wrong ones from {res.get('wrong_from', 'nothing')})")
    if "phases" not in res:
        print("  not run: no calibration pair of a kind it needs")
        return
    for name, (seen, served, bad) in res["phases"].items():
        label = f"static line {TH}" if name == "static" else f"learning, {name}"
        print(f"  {label:<26} hit rate {served / seen:>6.1%}  error of what was served "
              f"{(bad / served if served else 0.0):.3%} ({bad}/{served})")
    n_obs, k, rate, lo, hi = res["measured"]
    n_all, k_all, rate_all, lo_all, hi_all = res["measured_all"]
    print(f"  final line {res['line']:.3f}; measured error at or above it {rate:.3%} (95% CI "
          f"{lo:.3%} - {hi:.3%}, {k}/{n_obs}), over all observations {rate_all:.3%} "
          f"({lo_all:.3%} - {hi_all:.3%}, {k_all}/{n_all}), bound {res['bound']:.3%}; "
          f"{res['sampled']} hits "
          f"sampled ({res['sample']:.0%}), {res['evictions']} evictions; per-entry thresholds: "
          f"{res['below_line']}/{entries} below the line, median {res['own_p50']:.3f}, "
          f"lowest {res['own_min']:.3f}")


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
    ap.add_argument("--learned-line", action="store_true",
                    help="only the learned-line section (calibration pairs, no dev set)")
    ap.add_argument("--learned-pairs", type=int, default=200,
                    help="calibration pairs per kind for --learned-line alone")
    ap.add_argument("--wrong-share", type=float, default=0.05,
                    help="share of wrong candidates in the learned-line stream")
    ap.add_argument("--stream", type=int, default=20000, help="learned-line stream length")
    ap.add_argument("--entries", type=int, default=500, help="cached entries in that stream")
    ap.add_argument("--only", default="", help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.learned_line:
        n_pairs, pool = verifier_pool(args.calibration_seed, args.learned_pairs)
        print(f"learned line on {n_pairs} calibration pairs (seed {args.calibration_seed}), "
              f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
        print_learned_line(learned_line(pool, args.wrong_share, args.stream, args.entries),
                           args.wrong_share, args.stream, args.entries)
        return
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
    if cal is not None:
        print_learned_line(learned_line(cal["pool"], args.wrong_share, args.stream,
                                        args.entries), args.wrong_share, args.stream,
                           args.entries)
    print(f"embedding one question (batcher off the path, this process): p50 "
          f"{pct(emb, 50):.2f} ms, p99 {pct(emb, 99):.2f} ms; a verified hit costs the "
          f"embedding plus the lookup: p50 ~ {pct(emb, 50) + ver['hit_p50']:.2f} ms")


if __name__ == "__main__":
    main()
