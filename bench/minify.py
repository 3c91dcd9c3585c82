"""Key minification benchmark: token reduction and expansion latency on the corpus.

    .venv/bin/python bench/minify.py [--corpus bench/data/minify_corpus.jsonl] [--repeat 200]

Outputs are counted as compact JSON (what a model in JSON mode emits). Streaming chunks
are the minified output cut at cl100k token boundaries (one SSE delta per token).
Prints what it measured; nothing here asserts a threshold.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from app.core.minify import (StreamExpander, clear_cache, expand_json, expand_text,  # noqa: E402
                             minify_json, minify_schema, rewrite_messages)
from app.minify.tokens import get_counter, tiktoken_encoding  # noqa: E402

TOKENIZERS = ("cl100k_base", "o200k_base", "smollm2")


def compact(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def fmt_us(values: list[float]) -> str:
    return (f"p50 {pct(values, 0.5) * 1e6:7.1f} us  p99 {pct(values, 0.99) * 1e6:7.1f} us  "
            f"mean {statistics.fmean(values) * 1e6:7.1f} us")


def reduction(cases: list[dict]) -> None:
    print("token reduction (compact JSON output, original keys -> minified keys)")
    for name in TOKENIZERS:
        try:
            counter = get_counter(name)
        except LookupError as exc:
            print(f"  {name:<12} unavailable: {exc}")
            continue
        clear_cache()
        before = after = 0
        worst, best = 1.0, 0.0
        for case in cases:
            _, km = minify_schema(case["schema"], tokenizer=counter)
            b = counter.count(compact(case["output"]))
            a = counter.count(compact(minify_json(case["output"], km)))
            before, after = before + b, after + a
            worst, best = min(worst, 1 - a / b), max(best, 1 - a / b)
        print(f"  {name:<12} {before:6d} -> {after:6d} tokens  reduction {1 - after / before:6.1%}"
              f"  (per case {worst:.1%} .. {best:.1%}; mean output {before / len(cases):.0f}"
              f" -> {after / len(cases):.0f} tokens)")


def latency(cases: list[dict], repeat: int) -> None:
    enc = tiktoken_encoding("cl100k_base")
    counter = get_counter("cl100k_base")
    prepared = []
    for case in cases:
        _, km = minify_schema(case["schema"], tokenizer=counter)
        small = minify_json(case["output"], km)
        text = compact(small)
        chunks = [enc.decode([t]) for t in enc.encode(text)]
        assert "".join(chunks) == text
        prepared.append((km, small, text, chunks))
    n_tokens = statistics.fmean(len(p[3]) for p in prepared)
    print(f"\nexpansion latency, {len(cases)} responses x {repeat} runs, minified response "
          f"mean {n_tokens:.0f} cl100k tokens ({statistics.fmean(len(p[2]) for p in prepared):.0f} chars)")

    whole_obj, whole_text, stream_total, per_chunk = [], [], [], []
    clock = time.perf_counter
    for _ in range(repeat):
        for km, small, text, chunks in prepared:
            t0 = clock()
            expand_json(small, km)
            whole_obj.append(clock() - t0)
            t0 = clock()
            expand_text(text, km)
            whole_text.append(clock() - t0)
            ex = StreamExpander(km)
            t_start = clock()
            for ch in chunks:
                t0 = clock()
                ex.feed(ch)
                per_chunk.append(clock() - t0)
            ex.close()
            stream_total.append(clock() - t_start)
    print(f"  whole response, parsed object   {fmt_us(whole_obj)}")
    print(f"  whole response, text (scanner)  {fmt_us(whole_text)}")
    print(f"  streamed, per response (sum)    {fmt_us(stream_total)}")
    print(f"  streamed, per chunk (1 token)   {fmt_us(per_chunk)}")


def minify_cost(cases: list[dict], repeat: int) -> None:
    counter = get_counter("cl100k_base")
    cold, warm, msgs = [], [], []
    clock = time.perf_counter
    for _ in range(max(1, repeat // 20)):
        clear_cache()
        for case in cases:
            t0 = clock()
            _, km = minify_schema(case["schema"], tokenizer=counter)
            cold.append(clock() - t0)
            t0 = clock()
            minify_schema(case["schema"], tokenizer=counter)
            warm.append(clock() - t0)
            keys = ", ".join(o for _, o, _ in km.renames[:6])
            messages = [{"role": "system", "content": f"Extract the fields {keys} from the document."},
                        {"role": "user", "content": "Document text " * 40}]
            t0 = clock()
            rewrite_messages(messages, km)
            msgs.append(clock() - t0)
    print("\nS02 cost per request (cl100k)")
    print(f"  minify_schema, cache miss       {fmt_us(cold)}")
    print(f"  minify_schema, cache hit        {fmt_us(warm)}")
    print(f"  rewrite_messages                {fmt_us(msgs)}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", default=os.path.join(os.path.dirname(__file__), "data",
                                                         "minify_corpus.jsonl"))
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    with open(args.corpus, encoding="utf-8") as fh:
        cases = [json.loads(line) for line in fh if line.strip()]
    print(f"corpus {args.corpus}: {len(cases)} schemas")
    reduction(cases)
    latency(cases, args.repeat)
    minify_cost(cases, args.repeat)


if __name__ == "__main__":
    main()
