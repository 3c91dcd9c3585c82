"""S00 cache bench: false/true hits (Sluice vs plain cosine vs GPTCache's similarity evaluation)
on the same pairs and MiniLM embeddings, and lookup latency at 1k and 50k cached entries.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/cache.py [--sizes 1000 50000] [--probes 300] [--crowd 5000]
        [--threads 1] [--embedding auto|onnx|torch|sentence-transformers]

GPTCache is imported only here (bench/cache_baselines.py runs its real pipeline); install it
outside .venv, e.g.
    pip install --no-deps --target /tmp/gptcache_pkg gptcache cachetools
and point GPTCACHE_PATH at that folder (default /tmp/gptcache_pkg).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from app.contract.cache.embedding import BACKENDS, configure, embed, embed_many, get_encoder  # noqa: E402
from app.contract.cache.keys import build_key  # noqa: E402
from app.contract.cache.store import CacheStore  # noqa: E402
from app.core.entities import entity_profile, profiles_compatible  # noqa: E402
from app.contract.policy import DEFAULTS  # noqa: E402

PAIR_FILES = [ROOT / "app/cache/data/cache_pairs_sample.jsonl", ROOT / "tests/cache/data/pairs_heldout.jsonl"]
TH = DEFAULTS["cache_similarity_threshold"]


def rates(pairs, hits):
    same = [h for p, h in zip(pairs, hits) if p["same"]]
    diff = [h for p, h in zip(pairs, hits) if not p["same"]]
    return (sum(diff), sum(diff) / max(len(diff), 1), sum(same), sum(same) / max(len(same), 1))


def answer_of(text: str) -> str:
    return f"answer to: {text}"


def sluice_shared(pairs, va, vb) -> list[str | None]:
    """Every ``a`` in one tenant's real CacheStore (Redis), each ``b`` probed against all."""
    import redis
    client = redis.Redis.from_url(os.environ.get("SLUICE_REDIS_URL", "redis://127.0.0.1:6379/0"))
    ns = f"benchshared{uuid.uuid4().hex[:8]}"
    store, policy = CacheStore(client, ns), dict(DEFAULTS)
    body = lambda t: {"model": "auto", "temperature": 0, "messages": [{"role": "user", "content": t}]}  # noqa: E731
    try:
        for i, p in enumerate(pairs):
            store.store(build_key("shared", policy, "auto", body(p["a"])), va[i], {"choices": [{
                "index": 0, "finish_reason": "stop", "message": {
                    "role": "assistant", "content": answer_of(p["a"])}}]}, f"a{i}", 3600)
        out = []
        for i, p in enumerate(pairs):
            hit = store.lookup(build_key("shared", policy, "auto", body(p["b"])), vb[i], TH)
            out.append(hit.response["choices"][0]["message"]["content"] if hit else None)
        return out
    finally:
        keys = list(client.scan_iter(match=f"{ns}:*", count=5000))
        for j in range(0, len(keys), 1000):
            client.delete(*keys[j:j + 1000])


def quality(path: Path, with_gptcache: bool) -> None:
    from cache_baselines import gptcache_answers
    pairs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    va, vb = embed_many([p["a"] for p in pairs]), embed_many([p["b"] for p in pairs])
    vectors = {**{p["a"]: va[i] for i, p in enumerate(pairs)},
               **{p["b"]: vb[i] for i, p in enumerate(pairs)}}
    cos = (va * vb).sum(axis=1)
    same_bar = 1 - (2 - 2 * TH) / 4.0  # GPTCache's distance score (4 - squared L2) at cosine TH
    served = lambda answers: [a is not None for a in answers]  # noqa: E731
    isolated = {
        "sluice (entity guard + cos>=%.3f)" % TH: [bool(c >= TH and profiles_compatible(
            entity_profile(p["a"]), entity_profile(p["b"]))) for p, c in zip(pairs, cos)],
        "plain cosine >= %.3f (no guard)" % TH: [bool(c >= TH) for c in cos],
    }
    if with_gptcache:
        for thr, note in ((0.8, "its default; = cosine >= 0.600"), (same_bar, "= cosine >= %.3f" % TH)):
            isolated[f"gptcache SearchDistance thr={thr:.4f} ({note})"] = served(gptcache_answers(
                pairs, vectors, "distance", thr, shared=False, answer_of=answer_of))
    print(f"\n== {path.name}: {len(pairs)} pairs ({sum(p['same'] for p in pairs)} same), "
          f"one cache per pair (store a, probe b: the drill)")
    print(f"{'method':<62}{'false hits':>11}{'false rate':>11}{'true hits':>10}{'true rate':>10}")
    for name, hits in isolated.items():
        fh, fr, th, tr = rates(pairs, hits)
        print(f"{name:<62}{fh:>11}{fr:>11.2%}{th:>10}{tr:>10.2%}")
    print("   (SearchDistance on one stored entry is a monotone transform of cosine: the same "
          "decision as a cosine threshold)")

    shared = {"sluice CacheStore (Redis), one tenant": sluice_shared(pairs, va, vb)}
    if with_gptcache:
        for ev, thr, note in (("distance", 0.8, "default"), ("distance", same_bar, "cos bar"),
                              ("kreciprocal", same_bar, "cos bar")):
            name = {"distance": "SearchDistance", "kreciprocal": "KReciprocal k=3"}[ev]
            shared[f"gptcache {name} thr={thr:.4f} ({note})"] = gptcache_answers(
                pairs, vectors, ev, thr, shared=True, answer_of=answer_of)
    print(f"\n   all {len(pairs)} a's in one cache, each b probed against all of them (wrong = "
          f"served the answer to a question not known to mean the same as b)")
    print(f"{'method':<62}{'wrong':>7}{'false hits':>11}{'false rate':>11}{'true hits':>10}{'true rate':>10}")
    meaning = same_meaning(pairs)
    diff_n = sum(not p["same"] for p in pairs)
    same_n = len(pairs) - diff_n
    for name, answers in shared.items():
        right = [a is not None and meaning(a.removeprefix("answer to: "), p["b"])
                 for p, a in zip(pairs, answers)]
        wrong = sum(a is not None and not r for a, r in zip(answers, right))
        false = sum(a is not None and not r for p, a, r in zip(pairs, answers, right) if not p["same"])
        true = sum(r for p, r in zip(pairs, right) if p["same"])
        print(f"{name:<62}{wrong:>7}{false:>11}{false / max(diff_n, 1):>11.2%}{true:>10}"
              f"{true / max(same_n, 1):>10.2%}")


def same_meaning(pairs):
    """Texts known to ask the same thing: identical, or linked by same=true pairs (transitively)."""
    parent: dict[str, str] = {}

    def find(t: str) -> str:
        parent.setdefault(t, t)
        while parent[t] != t:
            parent[t] = parent[parent[t]]
            t = parent[t]
        return t
    for p in pairs:
        if p["same"]:
            parent[find(p["a"])] = find(p["b"])
    return lambda x, y: find(x) == find(y)


def pct(xs):
    xs = np.array(xs) * 1000
    return f"p50 {np.percentile(xs, 50):6.2f} ms  p99 {np.percentile(xs, 99):6.2f} ms"


def latency(size: int, probes: int) -> None:
    import redis
    client = redis.Redis.from_url(os.environ.get("SLUICE_REDIS_URL", "redis://127.0.0.1:6379/0"))
    ns = f"benchcache{uuid.uuid4().hex[:8]}"
    store = CacheStore(client, ns)  # Redis fast path (lookups never reach Qdrant while Redis is up)
    policy = dict(DEFAULTS)
    rng = np.random.default_rng(0)
    body = lambda t: {"model": "auto", "temperature": 0, "messages": [{"role": "user", "content": t}]}  # noqa: E731
    texts = [f"What is the warranty policy for SKU-{i} in Florida?" for i in range(size)]
    real_n = min(probes, size)
    real_vecs = embed_many(texts[:real_n])
    t0 = time.perf_counter()
    try:
        for i, t in enumerate(texts):
            key = build_key("bench", policy, "auto", body(t))
            if i < real_n:
                vec = real_vecs[i]
            else:
                vec = rng.standard_normal(384).astype(np.float32)
                vec /= np.linalg.norm(vec)
            store.store(key, vec, {"choices": [{"index": 0, "finish_reason": "stop", "message": {
                "role": "assistant", "content": f"answer {i}"}}]}, f"r{i}", 3600)
        fill = time.perf_counter() - t0
        exact, semantic, miss, lookup_only = [], [], [], []
        embed("warm up")
        for i in range(real_n):
            t = time.perf_counter()
            hit = store.lookup(build_key("bench", policy, "auto", body(texts[i])), None, TH)
            exact.append(time.perf_counter() - t)
            assert hit and hit.kind == "exact"
            para = f"Hi, what is the warranty policy for SKU-{i} in Florida? Thanks."
            t = time.perf_counter()
            key = build_key("bench", policy, "auto", body(para))
            hit = store.lookup(key, embed(key.text), TH)
            semantic.append(time.perf_counter() - t)
            semantic_ok = hit is not None and hit.kind == "semantic"
            vec = embed(key.text)  # the request's one vector, made before (shared with S01)
            t = time.perf_counter()
            key = build_key("bench", policy, "auto", body(para))
            hit = store.lookup(key, vec, TH)
            lookup_only.append(time.perf_counter() - t)
            semantic_ok = semantic_ok and hit is not None and hit.kind == "semantic"
            other = f"What is the warranty policy for SKU-{i + size} in Oregon?"
            t = time.perf_counter()
            key = build_key("bench", policy, "auto", body(other))
            hit = store.lookup(key, embed(key.text), TH)
            miss.append(time.perf_counter() - t)
            assert hit is None
        print(f"\n== latency at {size} cached entries (fill {fill:.1f} s, {real_n} probes each)")
        print(f"exact hit (key + Redis GET, no embedding): {pct(exact)}")
        print(f"semantic hit (embedding + key + bucket):  {pct(semantic)}   ({semantic_ok=} on the last)")
        print(f"semantic hit, lookup only (key + bucket): {pct(lookup_only)}   (the vector made beforehand)")
        print(f"miss (embedding + key + bucket):          {pct(miss)}")
        emb = []
        for i in range(min(100, real_n)):
            t = time.perf_counter()
            embed(texts[i] + " ?")
            emb.append(time.perf_counter() - t)
        print(f"embedding alone:                           {pct(emb)}")
        print(f"embedding, 32 concurrent requests:         {batched_embedding(texts[:32])}")
    finally:
        keys = list(client.scan_iter(match=f"{ns}:*", count=5000))
        for j in range(0, len(keys), 1000):
            client.delete(*keys[j:j + 1000])


def batched_embedding(texts: list[str], rounds: int = 20) -> str:
    """32 threads embed one text each at once (a gateway at 32 connections): the wall time of
    a round, per text, through the micro-batcher and with each text its own encoder call."""
    import threading
    from app.contract.cache.embedding import get_batcher

    def round_(fn) -> float:
        start = threading.Barrier(len(texts) + 1)
        threads = [threading.Thread(target=lambda t=t: (start.wait(), fn(t))) for t in texts]
        for th in threads:
            th.start()
        start.wait()
        t0 = time.perf_counter()
        for th in threads:
            th.join()
        return time.perf_counter() - t0

    def per_text(fn) -> float:
        walls = sorted(round_(fn) for _ in range(rounds))
        return walls[len(walls) // 2] / len(texts) * 1000

    batcher = get_batcher()
    if batcher is None:
        return "batcher off (EMBEDDING_BATCH_MAX 1)"
    before = len(batcher.stats.sizes)
    batched = per_text(embed)
    sizes = batcher.stats.sizes[before:]
    alone = per_text(lambda t: embed_many([t]))
    return (f"{batched:.2f} ms/text batched (mean batch {sum(sizes) / max(1, len(sizes)):.1f}) "
            f"vs {alone:.2f} ms/text one call each: x{alone / batched:.2f}")


CROWD_WORDS = ("""quick simple short clear formal friendly polite detailed careful gentle brief
plain honest direct calm warm""".split(), """summary letter reply note message email answer
outline draft review report story memo poem speech list""".split(), """happy serious kind
warm funny calm gentle proud""".split(), """modest confident hopeful upbeat sincere cheerful
relaxed thoughtful""".split())


def crowd_texts(n: int) -> list[str]:
    """Entity-free prompts with no prepositional phrase (common words only): one tenant's
    bucket gets all of them."""
    import itertools
    combos = itertools.product(*CROWD_WORDS)
    return [f"Write a {a} {b} that sounds {c} and {d}" for a, b, c, d in itertools.islice(combos, n)]


def crowded(size: int, probes: int) -> None:
    """One bucket with ``size`` entries: Sluice's mirrored bucket (warm, after another
    process added one entry, cold) against reading the whole bucket per lookup (the old
    layout's HGETALL + unpack + scan)."""
    import redis

    from app.contract.cache.store import _unpack
    client = redis.Redis.from_url(os.environ.get("SLUICE_REDIS_URL", "redis://127.0.0.1:6379/0"))
    ns = f"benchcrowd{uuid.uuid4().hex[:8]}"
    store, writer = CacheStore(client, ns), CacheStore(client, ns)  # two processes' views
    policy = dict(DEFAULTS)
    body = lambda t: {"model": "auto", "temperature": 0, "messages": [{"role": "user", "content": t}]}  # noqa: E731
    texts = crowd_texts(size)
    keys = [build_key("bench", policy, "auto", body(t)) for t in texts]
    assert len({k.composite for k in keys}) == 1, "crowd prompts must share one composite key"
    rng = np.random.default_rng(1)
    step = max(size // probes, 1)
    probe_ids = list(range(0, size, step))[:probes]  # spread over the bucket, oldest first
    real = dict(zip(probe_ids, embed_many([texts[i] for i in probe_ids])))
    answer = {"choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": "ok"}}]}
    t0 = time.perf_counter()
    try:
        for i, key in enumerate(keys):
            vec = real.get(i)
            if vec is None:
                vec = rng.standard_normal(384).astype(np.float32)
                vec /= np.linalg.norm(vec)
            writer.store(key, vec, answer, f"c{i}", 3600)
        fill = time.perf_counter() - t0
        bucket = store._k("b", "bench", keys[0].composite)
        paras = [texts[i] + "." for i in probe_ids]  # light: cosine ~0.97-0.98 for these
        pkeys = [build_key("bench", policy, "auto", body(p)) for p in paras]
        embed("warm up")
        cold, warm, after_add, old_layout, found, eligible = [], [], [], [], 0, 0
        for n, (i, pkey) in enumerate(zip(probe_ids, pkeys)):
            store.mirror.clear()
            t = time.perf_counter()
            store.lookup(pkey, embed(pkey.text), TH, exact=False)
            cold.append(time.perf_counter() - t)
            t = time.perf_counter()
            q = embed(pkey.text)
            hit = store.lookup(pkey, q, TH, exact=False)
            warm.append(time.perf_counter() - t)
            if float(q @ real[i]) >= TH:  # the paraphrase is within the threshold: must be found
                eligible += 1
                found += hit is not None and hit.request_id == f"c{i}"
            extra = build_key("bench", policy, "auto", body(texts[i] + " today"))
            vec = rng.standard_normal(384).astype(np.float32)
            writer.store(extra, vec / np.linalg.norm(vec), answer, f"x{n}", 3600)
            t = time.perf_counter()
            store.lookup(pkey, embed(pkey.text), TH, exact=False)
            after_add.append(time.perf_counter() - t)
            t = time.perf_counter()
            q = embed(pkey.text)
            fields = client.hgetall(bucket)
            vecs = np.stack([_unpack(v)[1] for v in fields.values()])
            int(np.argmax(vecs @ q))
            old_layout.append(time.perf_counter() - t)
        print(f"\n== crowded bucket: {size} entries under one composite key (fill {fill:.1f} s, "
              f"{len(probe_ids)} probes spread from oldest to newest)")
        print(f"best match found: {found}/{eligible} probes whose paraphrase (prompt + '.') has "
              f"cosine >= {TH} to its stored prompt ({len(probe_ids) - eligible} others are below it)")
        print(f"semantic hit, bucket copy in step:        {pct(warm)}   (incl. embedding)")
        print(f"semantic hit, after another process added one entry: {pct(after_add)}")
        print(f"semantic hit, cold copy (first lookup in a process): {pct(cold)}")
        print(f"old layout (HGETALL + unpack + scan per lookup):     {pct(old_layout)}")
    finally:
        keys_ = list(client.scan_iter(match=f"{ns}:*", count=5000))
        for j in range(0, len(keys_), 1000):
            client.delete(*keys_[j:j + 1000])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="*", default=[1000, 50000])
    ap.add_argument("--probes", type=int, default=300)
    ap.add_argument("--crowd", type=int, default=5000, help="entries in the crowded bucket (0: skip)")
    ap.add_argument("--threads", type=int, default=0,
                    help="intra-op threads for the embedding, torch's and onnxruntime's "
                         "(0: torch's default, 1 for onnxruntime)")
    ap.add_argument("--embedding", default="auto", choices=BACKENDS,
                    help="how embeddings are computed (app.contract.cache.embedding.configure)")
    args = ap.parse_args()
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    configure(args.embedding, threads=args.threads or 1)
    print(f"embedding: {get_encoder().name} (asked: {args.embedding}), torch threads "
          f"{torch.get_num_threads()}, load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} "
          f"CPUs (latency figures include the embedding where stated)")
    from cache_baselines import load_gptcache
    with_gptcache = load_gptcache()
    if not with_gptcache:
        print("(gptcache not importable: install it into GPTCACHE_PATH, see the docstring; "
              "its rows are skipped)")
    for path in PAIR_FILES:
        quality(path, with_gptcache)
    for size in args.sizes:
        latency(size, args.probes)
    if args.crowd:
        crowded(args.crowd, min(args.probes, 100))


if __name__ == "__main__":
    main()
