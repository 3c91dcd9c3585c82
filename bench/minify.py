"""Key minification benchmark: where output tokens go, token reduction per tokenizer, and
expansion latency (whole response, 250-token responses, per streamed chunk).

    .venv/bin/python bench/minify.py [--corpus bench/data/minify_corpus.jsonl] [--repeat 300]

The corpus holds realistic verbose enterprise schemas with an output valid under each;
its first 22 lines are the original corpus, the rest use $defs/$ref/anyOf/oneOf and the
verbose enum values enterprise systems emit. Outputs are counted as compact JSON
(separators "," ":") unless a section says otherwise. Streaming chunks are the minified
output cut at cl100k token boundaries (one SSE delta per token). The "as deployed" section
counts what the engine writes without Sluice (xgrammar's ", " ": ") against what it writes
behind Sluice on a pool tier (compact grammar). Prints what it measured;
nothing here asserts a threshold. "keys" rows use letter aliases (a, b, ...), "semantic"
rows a one-token word of each key (policy minify_alias_style) and, with +enums, of each
enum value (policy minify_enums): the gateway's defaults.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from app.core.minify import (MinifyOptions, StreamExpander, clear_cache,  # noqa: E402
                             expand_json, expand_text, minify_json, minify_schema,
                             rewrite_messages)
from app.contract.tokenizers import get_counter, smollm2_tokenizer, tiktoken_encoding  # noqa: E402

TOKENIZERS = ("cl100k_base", "o200k_base", "smollm2")
ORIGINAL_CASES = 22
KEYS = MinifyOptions(alias_style="letters")
ENUMS = MinifyOptions(minify_enums=True, alias_style="letters")
SEMANTIC = MinifyOptions(alias_style="semantic")
SEMANTIC_ENUMS = MinifyOptions(minify_enums=True, alias_style="semantic")
OPTION_SETS = (("keys", KEYS), ("keys+enums", ENUMS), ("semantic", SEMANTIC),
               ("semantic+enums", SEMANTIC_ENUMS))
TARGET = 0.378


def dumps(obj, separators=(",", ":")) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=separators)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def fmt_us(values: list[float]) -> str:
    return (f"p50 {pct(values, 0.5) * 1e6:7.1f} us  p99 {pct(values, 0.99) * 1e6:7.1f} us  "
            f"mean {statistics.fmean(values) * 1e6:7.1f} us")


# ------------------------------------------------------------------ where tokens go

def _segments(orig, mini, node, out: list[tuple[str, str]]) -> None:
    """(category, text) pieces of ``dumps(mini)``, categories from the original value and
    ``node`` (a probe map with every enum aliased): key, punct, enum, string, literal.
    Minification keeps the shape and order, so the two values walk in step."""
    if isinstance(orig, dict):
        out.append(("punct", "{"))
        for i, ((k, v), (mk, mv)) in enumerate(zip(orig.items(), mini.items())):
            out.append(("punct", ',"' if i else '"'))
            out.append(("key", json.dumps(mk, ensure_ascii=False)[1:-1]))
            out.append(("punct", '":'))
            hit = node.fwd.get(k) if node is not None else None
            _segments(v, mv, hit[1] if hit else None, out)
        out.append(("punct", "}"))
    elif isinstance(orig, list):
        out.append(("punct", "["))
        for i, (v, mv) in enumerate(zip(orig, mini)):
            if i:
                out.append(("punct", ","))
            _segments(v, mv, node.items if node is not None else None, out)
        out.append(("punct", "]"))
    elif isinstance(orig, str):
        cat = "enum" if node is not None and node.vals is not None else "string"
        out += [("punct", '"'), (cat, json.dumps(mini, ensure_ascii=False)[1:-1]),
                ("punct", '"')]
    else:
        out.append(("literal", dumps(mini)))


def _token_starts(text: str, tokenizer: str) -> list[int]:
    """Byte offset where each token of ``text`` starts."""
    if tokenizer == "smollm2":
        enc = smollm2_tokenizer().encode(text, add_special_tokens=False)
        return [len(text[:a].encode()) for a, _ in enc.offsets]
    enc = tiktoken_encoding(tokenizer)
    starts, pos = [], 0
    for t in enc.encode_ordinary(text):
        starts.append(pos)
        pos += len(enc.decode_single_token_bytes(t))
    return starts


def breakdown(orig, mini, node, tokenizer: str) -> dict[str, int]:
    """Tokens of ``dumps(mini)`` per category (a token counts where its first byte is)."""
    segs: list[tuple[str, str]] = []
    _segments(orig, mini, node, segs)
    cats: list[str] = []
    for cat, text in segs:
        cats += [cat] * len(text.encode())
    out = {c: 0 for c in ("key", "punct", "string", "enum", "literal")}
    for start in _token_starts("".join(t for _, t in segs), tokenizer):
        out[cats[start]] += 1
    return out


def where_tokens_go(cases: list[dict]) -> None:
    print("\nwhere the output tokens go (all cases, compact JSON; a token counts where its "
          "first byte is;\n'enum' = string values at locations that admit only enum/const "
          "values)")
    for name in TOKENIZERS:
        counter = get_counter(name)
        rows = {}
        for label, opts in (("original", None), *OPTION_SETS):
            tot = {c: 0 for c in ("key", "punct", "string", "enum", "literal")}
            for case in cases:
                _, probe = minify_schema(case["schema"], options=ENUMS)  # categories only
                mini = case["output"]
                if opts is not None:
                    _, km = minify_schema(case["schema"], tokenizer=counter, options=opts)
                    mini = minify_json(mini, km)
                for c, n in breakdown(case["output"], mini, probe.root, name).items():
                    tot[c] += n
            rows[label] = tot
        print(f"  {name}")
        for label, tot in rows.items():
            total = sum(tot.values())
            parts = "  ".join(f"{c} {n:5d} ({n / total:4.0%})" for c, n in tot.items())
            print(f"    {label:<15} {total:6d} tokens: {parts}")
        orig = rows["original"]
        print(f"    keys cost {rows['keys']['key']} tokens for "
              f"{sum(_count_keys(c['output']) for c in cases)} key occurrences; even at 0 "
              f"tokens per key the reduction would be {orig['key'] / sum(orig.values()):.1%}"
              f" (keys+enums at 0: {(orig['key'] + orig['enum']) / sum(orig.values()):.1%})")


def _count_keys(v) -> int:
    if isinstance(v, dict):
        return len(v) + sum(_count_keys(x) for x in v.values())
    if isinstance(v, list):
        return sum(_count_keys(x) for x in v)
    return 0


# ------------------------------------------------------------------ reduction

def totals(cases: list[dict], counter, options: MinifyOptions, separators=(",", ":")):
    before = after = 0
    per_case = []
    for case in cases:
        _, km = minify_schema(case["schema"], tokenizer=counter, options=options)
        b = counter.count(dumps(case["output"], separators))
        a = counter.count(dumps(minify_json(case["output"], km), separators))
        before, after = before + b, after + a
        per_case.append(1 - a / b)
    return before, after, per_case


def reduction(cases: list[dict]) -> None:
    print(f"\ntoken reduction, compact JSON output, original -> minified (target "
          f">= {TARGET:.1%})")
    subsets = ((f"corpus 1-{ORIGINAL_CASES}", cases[:ORIGINAL_CASES]),
               (f"all {len(cases)}", cases))
    for name in TOKENIZERS:
        counter = get_counter(name)
        clear_cache()
        for label, opts in OPTION_SETS:
            for sub_label, sub in subsets:
                b, a, per = totals(sub, counter, opts)
                print(f"  {name:<12} {label:<15} {sub_label:<13} {b:6d} -> {a:6d} tokens  "
                      f"reduction {1 - a / b:6.1%}  (per case {min(per):.1%} .. {max(per):.1%})")


def whitespace(cases: list[dict]) -> None:
    print("\nas deployed: separators are output tokens too (all cases). Without Sluice a grammar "
          "engine writes\nxgrammar's default ', ' and ': ' (the reference engine; vLLM with "
          "disable_any_whitespace; without it\nthe model picks any whitespace). On a pool tier "
          "S02 sends the minified schema as a grammar with\n',' and ':' (policy "
          "minify_compact_json, vLLM's structured_outputs.grammar); an external tier takes\n"
          "no grammar and keeps response_format, so there only the keys change (the 'spaced' "
          "column).\nThe gateway's defaults are the semantic+enums rows (policy "
          "minify_alias_style semantic, minify_enums on).\nReal generation realises less "
          "than these canonical counts: see bench/results/minify_quality.txt")
    spaced, compact = (", ", ": "), (",", ":")
    for name in TOKENIZERS:
        counter = get_counter(name)
        clear_cache()
        for label, opts in OPTION_SETS:
            b_sp, a_sp, _ = totals(cases, counter, opts, spaced)
            _, a_c, _ = totals(cases, counter, opts, compact)
            per_pool = [1 - counter.count(dumps(minify_json(c["output"], km)))
                        / counter.count(dumps(c["output"], spaced))
                        for c, km in ((c, minify_schema(c["schema"], tokenizer=counter,
                                                        options=opts)[1]) for c in cases)]
            print(f"  {name:<12} {label:<15} spaced {b_sp:5d} -> {a_sp:5d} ({1 - a_sp / b_sp:5.1%})"
                  f"   pool tier: spaced original -> compact minified {b_sp:5d} -> {a_c:5d} "
                  f"({1 - a_c / b_sp:5.1%}, per case {min(per_pool):.1%} .. {max(per_pool):.1%})")


# ------------------------------------------------------------------ latency

def _prepare(cases: list[dict], options: MinifyOptions):
    enc = tiktoken_encoding("cl100k_base")
    counter = get_counter("cl100k_base")
    out = []
    for case in cases:
        _, km = minify_schema(case["schema"], tokenizer=counter, options=options)
        small = minify_json(case["output"], km)
        text = dumps(small)
        chunks = [enc.decode([t]) for t in enc.encode(text)]
        assert "".join(chunks) == text
        assert json.loads(expand_text(text, km)[0]) == case["output"]
        out.append((case["name"], km, small, text, chunks))
    return out


def _time_case(km, small, text, chunks, acc: dict[str, list[float]]) -> None:
    clock = time.perf_counter
    t0 = clock()
    expand_json(small, km)
    acc["object"].append(clock() - t0)
    t0 = clock()
    expand_text(text, km)
    acc["text"].append(clock() - t0)
    ex = StreamExpander(km)
    t_start = clock()
    for ch in chunks:
        t0 = clock()
        ex.feed(ch)
        acc["chunk"].append(clock() - t0)
    ex.close()
    acc["stream"].append(clock() - t_start)


def latency(cases: list[dict], repeat: int) -> None:
    """Both option sets and all responses are timed in one interleaved loop, so a burst
    of load on this shared machine hits every group alike."""
    options = OPTION_SETS
    prepared = {label: _prepare(cases, opts) for label, opts in options}
    samples = {(label, i): {"object": [], "text": [], "stream": [], "chunk": []}
               for label, _ in options for i in range(len(cases))}
    for _ in range(repeat):
        for label, _ in options:
            for i, (_, km, small, text, chunks) in enumerate(prepared[label]):
                _time_case(km, small, text, chunks, samples[(label, i)])
    for label, _ in options:
        group_all = list(range(len(cases)))
        near = [i for i in group_all if 225 <= len(prepared[label][i][4]) <= 275]
        print(f"\nexpansion latency ({label}), cl100k; {repeat} runs per response")
        for title, group in (
                (f"responses of 225-275 tokens ({len(near)}: "
                 + ", ".join(f"{prepared[label][i][0]} {len(prepared[label][i][4])}"
                             for i in near) + ")", near),
                (f"all {len(cases)} responses, mean "
                 f"{statistics.fmean(len(p[4]) for p in prepared[label]):.0f} tokens",
                 group_all)):
            if not group:
                print(f"  {title}: none")
                continue
            acc = {k: [x for i in group for x in samples[(label, i)][k]]
                   for k in ("object", "text", "stream", "chunk")}
            print(f"  {title}")
            print(f"    whole response, parsed object   {fmt_us(acc['object'])}")
            print(f"    whole response, text            {fmt_us(acc['text'])}")
            print(f"    streamed, per response (sum)    {fmt_us(acc['stream'])}")
            print(f"    streamed, per chunk (1 token)   {fmt_us(acc['chunk'])}")


def minify_cost(cases: list[dict], repeat: int) -> None:
    """S02's own work per request, both styles interleaved pass by pass. Word checks of
    semantic aliases are cached per tokenizer for the life of the process, so after the
    first pass a cache miss here pays for the schema walk, not for tokenizing words."""
    counter = get_counter("cl100k_base")
    clock = time.perf_counter
    styles = (("keys+enums", ENUMS), ("semantic+enums", SEMANTIC_ENUMS))
    acc = {label: {"cold": [], "warm": [], "msgs": []} for label, _ in styles}
    for _ in range(max(1, repeat // 20)):
        for label, opts in styles:
            clear_cache()
            for case in cases:
                t0 = clock()
                _, km = minify_schema(case["schema"], tokenizer=counter, options=opts)
                acc[label]["cold"].append(clock() - t0)
                t0 = clock()
                minify_schema(case["schema"], tokenizer=counter, options=opts)
                acc[label]["warm"].append(clock() - t0)
                keys = ", ".join(o for _, o, _ in km.renames[:6])
                messages = [{"role": "system",
                             "content": f"Extract the fields {keys} from the document."},
                            {"role": "user", "content": "Document text " * 40}]
                t0 = clock()
                rewrite_messages(messages, km)
                acc[label]["msgs"].append(clock() - t0)
    for label, _ in styles:
        print(f"\nS02 cost per request (cl100k, {label})")
        print(f"  minify_schema, cache miss       {fmt_us(acc[label]['cold'])}")
        print(f"  minify_schema, cache hit        {fmt_us(acc[label]['warm'])}")
        print(f"  rewrite_messages                {fmt_us(acc[label]['msgs'])}")
    _grammar_cost(cases, counter, repeat)


def _grammar_cost(cases: list[dict], counter, repeat: int) -> None:
    """The compact grammar (pool tiers): built once per minified schema, then cached."""
    from app.core.minify_compact import _grammar, compact_grammar
    importlib.import_module("xgrammar")  # the import (once per process) is no per-schema cost
    schemas = [minify_schema(c["schema"], tokenizer=counter, options=SEMANTIC)[0] for c in cases]
    cold, warm, size = [], [], []
    for _ in range(max(1, repeat // 60)):
        _grammar.cache_clear()
        for schema in schemas:
            t0 = time.perf_counter()
            g = compact_grammar(schema)
            cold.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            compact_grammar(schema)
            warm.append(time.perf_counter() - t0)
            size.append(len(g or ""))
    print(f"\ncompact grammar for a pool tier (semantic aliases; EBNF of {min(size)}.."
          f"{max(size)} chars)")
    print(f"  compact_grammar, cache miss     {fmt_us(cold)}")
    print(f"  compact_grammar, cache hit      {fmt_us(warm)}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", default=os.path.join(os.path.dirname(__file__), "data",
                                                         "minify_corpus.jsonl"))
    parser.add_argument("--repeat", type=int, default=300)
    args = parser.parse_args()
    with open(args.corpus, encoding="utf-8") as fh:
        cases = [json.loads(line) for line in fh if line.strip()]
    print(f"corpus {args.corpus}: {len(cases)} schemas ({ORIGINAL_CASES} original, "
          f"{len(cases) - ORIGINAL_CASES} with $defs/$ref/anyOf/oneOf and verbose enums)")
    where_tokens_go(cases)
    reduction(cases)
    whitespace(cases)
    print(f"\nload average before timing: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    latency(cases, args.repeat)
    minify_cost(cases, args.repeat)
    print(f"load average after timing: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
