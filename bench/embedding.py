"""Request embedding bench: sentence-transformers' encode vs the same BERT called from torch vs
the ONNX export under onnxruntime, in one process, interleaved (so a loaded machine slows all
three alike), per single query, for a short question and for a long system prompt + question.
Also checks that the three give the same vectors (and the same cache decisions) on the pairs.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/embedding.py [--threads 1] [--rounds 200]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from app.contract.cache import encoders  # noqa: E402
from app.contract.cache.embedding import get_model, semantic_text  # noqa: E402
from app.contract.policy import DEFAULTS  # noqa: E402

PAIRS = ROOT / "app/cache/data/cache_pairs_sample.jsonl"
QUESTION = "What is the refund window for order ORD-48213 if the blender arrived damaged?"
OTHER_QUESTION = "How do I change the delivery address on an order that has already shipped?"


def untruncated_tokenizer(mdir: Path):
    """The model's tokenizer without its truncation (tokenizer.json says 128), to count."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(mdir / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return tok


def system_prompt(tokens: int, counter) -> str:
    """A support-agent system prompt of about ``tokens`` MiniLM tokens (rules, policies, tone)."""
    rng = random.Random(7)
    subjects = ["refunds", "shipping", "warranty claims", "account security", "invoices",
                "subscriptions", "returns", "gift cards", "store pickup", "price matching"]
    verbs = ["always confirm", "never promise", "politely explain", "escalate to a human",
             "cite the policy section on", "ask for the order number before discussing"]
    sentences = ["You are Acme's customer support assistant. Follow every rule below."]
    total = len(counter.encode(sentences[0], add_special_tokens=False).ids)
    while total < tokens:
        s = (f"Rule {len(sentences)}: when the customer asks about {rng.choice(subjects)}, "
             f"{rng.choice(verbs)} {rng.choice(subjects)} within {rng.randint(2, 60)} days; "
             f"keep answers under {rng.randint(3, 9)} sentences.")
        sentences.append(s)
        total += len(counter.encode(s, add_special_tokens=False).ids)
    return " ".join(sentences)


def pct(xs: list[float]) -> tuple[float, float]:
    a = np.asarray(xs) * 1e3
    return float(np.percentile(a, 50)), float(np.percentile(a, 99))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads (torch and onnxruntime)")
    ap.add_argument("--rounds", type=int, default=200, help="timed calls per encoder and text")
    ap.add_argument("--long-tokens", type=int, default=4500)
    ap.add_argument("--cache-dir", default="", help="ONNX export cache (default: a fresh temp dir, "
                    "so the export time is measured)")
    args = ap.parse_args()
    import onnxruntime
    import torch
    torch.set_num_threads(args.threads)
    print(f"threads {args.threads} (torch and onnxruntime {onnxruntime.__version__}), torch "
          f"{torch.__version__}, load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")

    mdir = encoders.model_dir()
    t = time.perf_counter()
    model = get_model()
    load_st = time.perf_counter() - t
    cache_dir = Path(args.cache_dir) if args.cache_dir else Path(tempfile.mkdtemp(prefix="embbench"))
    t = time.perf_counter()
    folder = encoders.cached_export(cache_dir, mdir, lambda: model)
    export_s = time.perf_counter() - t
    t = time.perf_counter()
    onnx_enc = encoders.load_onnx(cache_dir, mdir, lambda: model, args.threads)
    load_onnx = time.perf_counter() - t
    encs = {"sentence-transformers encode": encoders.SentenceTransformerEncoder(model),
            "plain torch (inference_mode)": encoders.TorchEncoder(model, mdir),
            f"onnxruntime, {args.threads} thread(s)": onnx_enc}
    if (os.cpu_count() or 1) > args.threads:
        encs[f"onnxruntime, {args.threads + 1} threads"] = encoders.load_onnx(
            cache_dir, mdir, lambda: model, args.threads + 1)
    print(f"sentence-transformers load {load_st:.2f} s; ONNX export {export_s:.2f} s "
          f"({(folder / 'model.onnx').stat().st_size / 1e6:.1f} MB), ONNX load from cache "
          f"{load_onnx:.2f} s (incl. the probe check)")

    # --- same vectors? ------------------------------------------------------------------
    pairs = [json.loads(x) for x in PAIRS.read_text().splitlines() if x.strip()]
    tok, counter = encoders.Tokenizer(mdir), untruncated_tokenizer(mdir)
    whole = encoders.Tokenizer(mdir).tok  # truncates after tokenizing all of it
    long_sys = system_prompt(args.long_tokens, counter)
    long_text = semantic_text([{"role": "system", "content": long_sys},
                               {"role": "user", "content": QUESTION}])
    long_other = semantic_text([{"role": "system", "content": long_sys},
                                {"role": "user", "content": OTHER_QUESTION}])
    texts = [p["a"] for p in pairs] + [p["b"] for p in pairs]
    ref = encs["sentence-transformers encode"].encode(texts)
    th = DEFAULTS["cache_similarity_threshold"]
    n = len(pairs)
    ref_hit = (ref[:n] * ref[n:]).sum(1) >= th
    print(f"\n== same vectors: {len(texts)} texts from {PAIRS.name}, batch and one at a time, "
          f"vs encode; cache decisions at cosine >= {th} on its {n} pairs")
    for name, enc in list(encs.items())[1:3]:
        batch = enc.encode(texts)
        single = np.stack([enc.encode([x])[0] for x in texts[:200]])
        hit = (batch[:n] * batch[n:]).sum(1) >= th
        print(f"{name:30s} min cosine batch {(batch * ref).sum(1).min():.7f}  single "
              f"{(single * ref[:200]).sum(1).min():.7f}  max |diff| {np.abs(batch - ref).max():.2e}  "
              f"decisions changed {int((hit != ref_hit).sum())}/{n}")

    # --- what the long request embeds -----------------------------------------------------
    full = len(counter.encode(long_text, add_special_tokens=True).ids)
    kept = int(tok([long_text])["attention_mask"].sum())
    sys_tokens = len(counter.encode(long_sys, add_special_tokens=False).ids)
    v = onnx_enc.encode([long_text, long_other])
    print(f"\n== long request: system prompt {sys_tokens} tokens + question; semantic_text is "
          f"{full} tokens, the model keeps the first {kept} (max_seq_length {tok.max_length}):")
    print(f"   the question is past the cut; cosine between two requests with the same system "
          f"prompt and different questions = {float(v[0] @ v[1]):.6f}")

    # --- latency, interleaved -------------------------------------------------------------
    print(f"\n== latency per single query, {args.rounds} calls each, interleaved "
          f"(p50 / p99 ms; ratio = encode's p50 / this p50)")
    for label, text in (("short question", QUESTION), (f"{sys_tokens}-token system prompt + question",
                                                       long_text)):
        times = {k: [] for k in encs}
        tok_times, whole_times = [], []
        for enc in encs.values():
            enc.encode([text])
            enc.encode([text])
        for _ in range(args.rounds):
            for k, enc in encs.items():
                t = time.perf_counter()
                enc.encode([text])
                times[k].append(time.perf_counter() - t)
            t = time.perf_counter()
            tok([text])
            tok_times.append(time.perf_counter() - t)
            t = time.perf_counter()
            whole.encode(text)
            whole_times.append(time.perf_counter() - t)
        base = pct(times["sentence-transformers encode"])[0]
        print(f"-- {label} ({int(tok([text])['attention_mask'].sum())} tokens embedded)")
        for k, xs in times.items():
            p50, p99 = pct(xs)
            print(f"   {k:30s} p50 {p50:7.2f}  p99 {p99:7.2f}   x{base / p50:.2f}")
        p50, p99 = pct(tok_times)
        print(f"   {'(our tokenizer call alone)':30s} p50 {p50:7.2f}  p99 {p99:7.2f}")
        p50, p99 = pct(whole_times)
        print(f"   {'(tokenizing the whole text)':30s} p50 {p50:7.2f}  p99 {p99:7.2f}")
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
