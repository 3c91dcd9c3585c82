"""Does key minification keep extraction quality? SmolLM2-135M (the reference engine, in
process, greedy) on bench/data/minify_quality.jsonl: support e-mails with gold fields.

    .venv/bin/python bench/minify_quality.py [--limit N] [--conditions original,prefix,...]

Conditions (same documents, same client instructions that name the fields):
  original        the client's schema, no minification
  original+compact+hint  the client's keys, compact grammar and style hint (no minification)
  prefix          letter aliases (a, b, ...), descriptions "original_key: ..." (S02's),
                  mentions of keys in the instructions rewritten to aliases
  semantic        prefix with semantic aliases: a one-token word of each key
                  (customer_email_address -> email; policy minify_alias_style)
  semantic+compact  semantic, with the minified schema sent as a grammar with "," and ":"
                  separators (what S02 sends a pool tier: policy minify_compact_json);
                  the other conditions get the schema, which xgrammar writes with ", " ": "
  keep            letter aliases, descriptions kept as they were
  legend          prefix + a system line that says what each alias means
  legend+enums    legend with enum values aliased too (policy minify_enums), letters
  semantic+enums  semantic, with enum values aliased to a word of the value only that value
                  has (HIGH_PRIORITY_SERVICE_DOWN -> high; policy minify_enums)
  semantic+enums+compact  both
  +hint           with the compact grammar, the instruction line that shows the compact
                  style (policy minify_style_hint): what S02 sends a pool tier

The engine (like vLLM) turns the schema into a grammar and never shows it to the model,
so descriptions cannot reach the model; "prefix" and "keep" differ only in them. Scores
are per field, exact match after expansion back to the client's keys. Prints what it saw.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from app.core.minify import (MinifyOptions, expand_text, legend_text,  # noqa: E402
                             minify_response_format, rewrite_messages)

SCHEMA = {"type": "object", "additionalProperties": False, "properties": {
    "customer_full_name": {"type": "string", "description": "Sender's name"},
    "customer_email_address": {"type": "string", "description": "Sender's e-mail"},
    "ticket_priority_level": {"type": "string", "description": "How urgent",
                              "enum": ["HIGH_PRIORITY_SERVICE_DOWN",
                                       "LOW_PRIORITY_ROUTINE_REQUEST"]},
    "affected_product_name": {"type": "string", "description": "Product named"},
    "requested_refund_flag": {"type": "boolean", "description": "Asks for money back"}},
    "required": ["customer_full_name", "customer_email_address", "ticket_priority_level",
                 "affected_product_name", "requested_refund_flag"]}
FMT = {"type": "json_schema", "json_schema": {"name": "ticket", "schema": SCHEMA}}
INSTRUCTIONS = ("Read the support e-mail and answer in JSON with customer_full_name, "
                "customer_email_address, ticket_priority_level (HIGH_PRIORITY_SERVICE_DOWN "
                "if the product is down, else LOW_PRIORITY_ROUTINE_REQUEST), "
                "affected_product_name and requested_refund_flag.")
CONDITIONS = ("original", "original+compact+hint", "prefix", "semantic", "semantic+compact", "semantic+compact+hint",
              "semantic+enums", "semantic+enums+compact", "semantic+enums+compact+hint", "keep", "legend", "legend+enums")


def request_for(condition: str, text: str, counter) -> tuple[list[dict], dict, object]:
    messages = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": text}]
    if condition == "original":
        return messages, FMT, None
    if condition == "original+compact+hint":   # no key changes: what compact + hint alone do
        from app.core.minify_compact import compact_grammar, with_style_hint
        return with_style_hint(messages), {"type": "grammar",
                                           "grammar": compact_grammar(SCHEMA)}, None
    options = MinifyOptions(describe="keep" if condition == "keep" else "prefix",
                            minify_enums="enums" in condition,
                            alias_style="semantic" if condition.startswith("semantic")
                            else "letters")
    rf, keymap = minify_response_format(FMT, tokenizer=counter, options=options)
    if "compact" in condition:
        from app.core.minify_compact import compact_grammar
        rf = {"type": "grammar", "grammar": compact_grammar(rf["json_schema"]["schema"])}
    messages = rewrite_messages(messages, keymap)
    if condition.endswith("hint"):
        from app.core.minify_compact import with_style_hint
        messages = with_style_hint(messages)
    if condition.startswith("legend"):
        system = messages[0]["content"] + "\n" + legend_text(keymap)
        messages[0] = {**messages[0], "content": system}
    return messages, rf, keymap


def generate(engine, messages: list[dict], rf: dict) -> tuple[str, int, int]:
    from app.engine.core import Job
    events: list[tuple] = []
    ids = engine.encode_chat([dict(m) for m in messages])
    engine.run(Job(model=engine.served_model_name, prompt_ids=ids, emit=events.append,
                   max_tokens=120, temperature=0.0, response_format=rf))
    text = "".join(e[1] for e in events if e[0] == "token")
    usage = next(e[2] for e in events if e[0] == "done")
    return text, usage["prompt_tokens"], usage["completion_tokens"]


def score(answer: str, gold: dict, per_field: dict[str, int]) -> int:
    try:
        got = json.loads(answer)
    except ValueError:
        return 0
    norm = lambda v: v.strip().lower() if isinstance(v, str) else v  # noqa: E731
    right = [k for k, v in gold.items() if norm(got.get(k)) == norm(v)]
    for k in right:
        per_field[k] += 1
    return len(right)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--conditions", default=",".join(CONDITIONS),
                        help=f"comma-separated subset of {', '.join(CONDITIONS)}")
    args = parser.parse_args()
    conditions = [c for c in args.conditions.split(",") if c]
    unknown = set(conditions) - set(CONDITIONS)
    if unknown:
        parser.error(f"unknown conditions: {', '.join(sorted(unknown))}")
    from app.engine.core import Engine
    from app.engine.model import resolve_model_path
    from app.contract.tokenizers import get_counter
    path = os.path.join(os.path.dirname(__file__), "data", "minify_quality.jsonl")
    with open(path, encoding="utf-8") as fh:
        items = [json.loads(line) for line in fh if line.strip()]
    items = items[:args.limit] if args.limit else items
    counter = get_counter("smollm2")
    engine = Engine(resolve_model_path("smollm2"), "smollm2")
    print(f"{len(items)} support e-mails x {len(SCHEMA['properties'])} fields, SmolLM2-135M "
          f"greedy, grammar from the schema (xgrammar, fixed separators: ', ' ': ' or, for "
          f"+compact, ',' ':')")
    # correct, fields, prompt, completion, and the completion's canonical tokenization
    totals = {c: [0, 0, 0, 0, 0] for c in conditions}
    per_field = {c: {k: 0 for k in SCHEMA["properties"]} for c in conditions}
    answers: dict[str, list[str]] = {c: [] for c in conditions}
    t0 = time.time()
    for item in items:
        for cond in conditions:
            messages, rf, keymap = request_for(cond, item["text"], counter)
            raw, p_tok, c_tok = generate(engine, messages, rf)
            answer = raw if keymap is None else expand_text(raw, keymap)[0]
            answers[cond].append(answer)
            t = totals[cond]
            t[0] += score(answer, item["gold"], per_field[cond])
            t[1] += len(item["gold"])
            t[2] += p_tok
            t[3] += c_tok
            t[4] += counter.count(raw)
    print(f"({time.time() - t0:.0f} s)\n")
    print("output tok = tokens the engine generated; canonical = the same text tokenized "
          "afresh (a constrained\nmodel need not pick the tokenizer's own merges, e.g. '\":' "
          "'\"' where '\":\"' is one token)")
    print(f"{'condition':<30}{'fields right':>14}{'prompt tok':>12}{'output tok':>12}"
          f"{'canonical':>11}")
    for cond, (ok, n, p_tok, c_tok, canon) in totals.items():
        print(f"{cond:<30}{ok:>7}/{n:<4} {ok / n:5.0%}{p_tok:>10}{c_tok:>12}{canon:>11}")
    print(f"\nright per field ({len(items)} each)")
    print(f"{'condition':<30}" + "".join(f"{k[:22]:>24}" for k in SCHEMA["properties"]))
    for cond in conditions:
        print(f"{cond:<30}" + "".join(f"{n:>24}" for n in per_field[cond].values()))
    if "prefix" in answers and "keep" in answers:
        same = sum(a == b for a, b in zip(answers["prefix"], answers["keep"]))
        print(f"\nprefix vs keep: {same}/{len(items)} answers identical")
    for cond in conditions:
        _, keymap = request_for(cond, "", counter)[1:]
        if keymap is not None:
            print(f"\naliases, {cond}: " + ", ".join(f"{o} -> {a}" for _, o, a in
                                                    (*keymap.renames, *keymap.value_renames)))
    for cond in conditions:
        print(f"\nfirst answers, {cond}:")
        for a in answers[cond][:2]:
            print(f"  {a}")


if __name__ == "__main__":
    main()
