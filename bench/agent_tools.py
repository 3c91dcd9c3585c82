"""Tool-definition retrieval on a 50-tool multi-turn agent workload (issue 23).

    .venv/bin/python bench/agent_tools.py [--k 4] [--tasks 40] [--no-engine]

The workload (bench/data/agent_tools.py): 50 tools in ten domains and 40 tasks, each a
user request and the calls a correct agent makes (1-3). Every task is replayed turn by
turn as an agent sends it: system prompt, the request, then each earlier call and its
tool result; turn i needs the task's i-th tool, the last turn answers in text. Each turn
is sent twice, to the same reference engine under two cache salts (day 2, below):

- ``full``: all 50 tools, as the agent declares them;
- ``retrieval``: the tools the gateway's policy sends (``app.gateway.tool_retrieval.
  select_for``, the gateway's MiniLM field vectors): the k (to k+2) best scored for the
  user turns, their id lookups, and every tool called earlier, by name; with ``--stubs``
  (policy ``tool_retrieval_stubs``) the next best scored as stubs, and with ``--full``
  (``tool_retrieval_full``) only that many of the scored picks in full, the rest as stubs,
  and with ``--names`` (``tool_retrieval_names``) that many more past the stubs by name
  alone; a stub or a name counts as sent for recall, with its own tokens, and the recall
  lines say how many of their hits were sent by name alone.

Recall is measured on three days of the workflow: day 1 the tasks as written, with the
workflow memory (tools called by past conversations that asked alike) empty at the start
and learning as the tasks run; day 2 the same 40 kinds of task in other words, with other
names and places (``PARAPHRASES``), on day 1's memory; day 3 (``HELDOUT``) yet other
words, written before the scoring was reworked, held out from the first round of changes
(chosen on day 1), on day 1's memory and on an empty one; day 4 (``HELDOUT_2``) another
wording, held out from the second round (chosen on days 1-3); day 5 (``HELDOUT_3``)
and day 6 (``HELDOUT_4``) two more, written and committed before the third round, held
out from it (day 6 not run until that round was fixed); day 7 (``HELDOUT_5``) and day 8
(``HELDOUT_6``), written and committed before the fourth round and not run until it was
fixed, held out from it (chosen on days 1-6): the held-out figures; day 9 (``HELDOUT_7``),
written and committed before the fifth round (the name-only tier, chosen on days 1-8) and
not run until it was fixed; day 10 (``HELDOUT_8``), written and committed after day 9's
first run and before the change its miss suggested (a named tool's lookup by name), not
run until that was fixed.

Per arm it prints prompt tokens per turn, tool-definition tokens per turn (SmolLM2
tokenizer, counted as the ledger counts them), the engine's prefix-cache hit rate (its
``usage.prompt_tokens_details.cached_tokens``) over the whole prompt and over the static
system prompt, and cost per task at the seed's tier-1 and frontier prices (prompt, cached
and completion tokens; completion = the agent's calls and answer as scripted, the same
in both arms). Recall: the share of tool-calling turns whose needed tool was sent.

The engine serves a small random Llama with SmolLM2's tokenizer and a 16k window (the
full arm's prompts are ~11k tokens, past SmolLM2-135M's 8k): prefill, prefix cache and
token counts are the engine's own; the answers are not used (the replay is scripted).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import OrderedDict
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench.data.agent_tools import TASKS, tools as make_tools  # noqa: E402

SYSTEM = ("You are Acme's operations assistant. You act for the signed-in employee through "
          "the tools you are given and nothing else. Before acting, restate the goal in one "
          "short sentence. Call one tool at a time and wait for its result; never invent a "
          "result, an id or an email address. If a tool fails, say what failed and stop. "
          "Money amounts are in the account's currency unless the user names another. Dates "
          "are in the user's timezone (Europe/Berlin) unless the user names another. Never "
          "share a document outside the company domain acme.com without the user confirming "
          "it in this conversation. Keep answers under 80 words, plain text, no markdown. "
          "When a task is done, say what you did and give the ids the tools returned.")
TIER1 = {"price_input_per_m": Decimal("0.06"), "price_cached_input_per_m": Decimal("0.015"),
         "price_output_per_m": Decimal("0.18")}
FRONTIER = {"price_input_per_m": Decimal("3.50"), "price_cached_input_per_m": Decimal("0.875"),
            "price_output_per_m": Decimal("10.50")}


def turns(task: tuple[str, list[str]]):
    """(messages, the tool this turn needs or None, the scripted completion) per turn."""
    request, calls = task
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": request}]
    for i, name in enumerate(calls + [None]):
        if name is None:
            yield list(messages), None, "Done: " + ", ".join(calls) + " ran; ids above."
            return
        call = {"id": f"call_{i}", "type": "function",
                "function": {"name": name, "arguments": json.dumps({"query": request[:40]})}}
        yield list(messages), name, json.dumps({"name": name, "arguments": {"query": "..."}})
        messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": f"call_{i}",
                      "content": json.dumps({"ok": True, "id": f"r{i}-{abs(hash(name)) % 997}"})}]


STUBS, FULL, NAMES = 0, None, 0   # set by --stubs, --full, --names


def selection(tools, messages, k, memory):
    """What the gateway's ``tool_retrieval.select`` sends (same function, one workflow)."""
    from app.contract.cache.embedding import embed

    from app.core.tool_select import query_text
    from app.gateway.tool_retrieval import clause_vectors, select_for
    query = query_text(messages)
    return select_for(tools, messages, "auto", k=k, pinned=[], qvec=embed(query), query=query,
                      key=("bench", "agent"), memory=memory, clauses=clause_vectors(query),
                      stubs=STUBS, full=FULL, by_name=NAMES)


def cost(prices, prompt, cached, completion) -> Decimal:
    from app.core.pricing import request_cost
    return request_cost(prices, prompt, cached, completion)


def start_engine(workdir: Path):
    """A 2-layer random Llama, SmolLM2 tokenizer, 16k positions, on the reference engine."""
    from app.engine.model import build_tiny_llama
    from tests.engine.conftest import EngineProcess
    folder = build_tiny_llama(workdir / "tiny16k")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["max_position_embeddings"] = 16384
    (folder / "config.json").write_text(json.dumps(cfg))
    eng = EngineProcess(str(folder), "agent", workdir / "engine.log",
                        extra=["--max-model-len", "16384", "--max-prefix-tokens", "400000",
                               "--enable-auto-tool-choice", "--tool-call-parser", "hermes"])
    eng.wait_healthy(180)
    return eng


def static_tokens(tokenizer) -> int:
    """Tokens of the system prompt as the engine's template starts every prompt."""
    text = tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM}],
                                         tokenize=False)
    return len(tokenizer.encode(text, add_special_tokens=False)) - 2  # "<|im_end|>\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--stubs", type=int, default=0,
                    help="policy tool_retrieval_stubs: tools sent as stubs past the k")
    ap.add_argument("--full", type=int, default=0,
                    help="policy tool_retrieval_full: of the scored picks, how many go in "
                         "full (0: all)")
    ap.add_argument("--names", type=int, default=0,
                    help="policy tool_retrieval_names: tools sent by name alone past the "
                         "stubs")
    ap.add_argument("--tasks", type=int, default=len(TASKS))
    ap.add_argument("--no-engine", action="store_true", help="selection and counts only")
    args = ap.parse_args()
    global STUBS, FULL, NAMES
    STUBS, FULL, NAMES = args.stubs, args.full or None, args.names

    from app.contract.tokenizers import get_counter
    from app.gateway.tool_retrieval import _tokens, field_vectors
    counter = get_counter("smollm2")
    tools = make_tools()
    per_tool = {t["function"]["name"]: _tokens([t], counter) for t in tools}
    full_tokens = sum(per_tool.values())
    t0 = time.perf_counter()
    n_fields = sum(len(v) for v in field_vectors(tools))
    embed_s = time.perf_counter() - t0
    tasks = TASKS[:args.tasks]
    print(f"workload: {len(tools)} tools ({full_tokens} definition tokens, "
          f"{min(per_tool.values())}-{max(per_tool.values())} per tool, SmolLM2 tokenizer), "
          f"{len(tasks)} tasks, {sum(len(c) + 1 for _, c in tasks)} turns, k={args.k}, "
          f"full={args.full or 'all'}, stubs={args.stubs}, names={args.names}")
    print(f"tool vectors: {n_fields} fields of {len(tools)} tools embedded in "
          f"{embed_s * 1000:.0f} ms (once per process)")

    from app.gateway.tool_retrieval import WorkflowMemory
    memories = [WorkflowMemory()]
    sel_ms = []
    by_name = [0]

    def replay(day: list, memory) -> tuple[list, int, int, list]:
        plan, need, hit, misses = [], 0, 0, []
        named = 0
        for ti, task in enumerate(day):
            for messages, needed, completion in turns(task):
                t0 = time.perf_counter()
                sel = selection(tools, messages, args.k, memory)
                sel_ms.append((time.perf_counter() - t0) * 1000)
                if needed is not None:
                    need += 1
                    if needed in sel.names:
                        hit += 1
                        named += needed in sel.named
                    else:
                        misses.append((task[0], needed, sorted(sel.names),
                                       sel.ranked.index(needed) + 1))
                plan.append((ti, messages, sel, completion))
        by_name[0] = named   # hits whose tool went by name alone, read after each day
        return plan, need, hit, misses

    from bench.data.agent_tools import HELDOUT, HELDOUT_2, HELDOUT_3, HELDOUT_4, HELDOUT_5, \
        HELDOUT_6, HELDOUT_7, HELDOUT_8, PARAPHRASES

    def copy(memory):
        out = WorkflowMemory()
        out.data = {key: OrderedDict(v) for key, v in memory.data.items()}
        return out

    _, need1, hit1, misses1 = replay(tasks, memories[-1])
    named_1_8 = by_name[0]   # summed over the days of the days 1-8 line
    day1_memory = copy(memories[-1])
    day2 = [(PARAPHRASES[i], calls) for i, (_, calls) in enumerate(tasks)]
    day3 = [(HELDOUT[i], calls) for i, (_, calls) in enumerate(tasks)]
    plan, need, hit, misses = replay(day2, memories[-1])
    named_1_8 += by_name[0]
    _, need3, hit3, misses3 = replay(day3, copy(day1_memory))
    named_1_8 += by_name[0]
    _, need3c, hit3c, misses3c = replay(day3, WorkflowMemory())
    day4 = [(HELDOUT_2[i], calls) for i, (_, calls) in enumerate(tasks)]
    _, need4, hit4, misses4 = replay(day4, copy(day1_memory))
    named_1_8 += by_name[0]
    day5 = [(HELDOUT_3[i], calls) for i, (_, calls) in enumerate(tasks)]
    plan5, need5, hit5, misses5 = replay(day5, copy(day1_memory))
    named_1_8 += by_name[0]
    _, need5c, hit5c, _ = replay(day5, WorkflowMemory())
    day6 = [(HELDOUT_4[i], calls) for i, (_, calls) in enumerate(tasks)]
    plan6, need6, hit6, misses6 = replay(day6, copy(day1_memory))
    named_1_8 += by_name[0]
    _, need6c, hit6c, _ = replay(day6, WorkflowMemory())
    day7 = [(HELDOUT_5[i], calls) for i, (_, calls) in enumerate(tasks)]
    plan7, need7, hit7, misses7 = replay(day7, copy(day1_memory))
    named_1_8 += by_name[0]
    _, need7c, hit7c, _ = replay(day7, WorkflowMemory())
    day8 = [(HELDOUT_6[i], calls) for i, (_, calls) in enumerate(tasks)]
    plan8, need8, hit8, misses8 = replay(day8, copy(day1_memory))
    named_1_8 += by_name[0]
    _, need8c, hit8c, _ = replay(day8, WorkflowMemory())
    day9 = [(HELDOUT_7[i], calls) for i, (_, calls) in enumerate(tasks)]
    plan9, need9, hit9, misses9 = replay(day9, copy(day1_memory))
    named_9 = by_name[0]
    _, need9c, hit9c, _ = replay(day9, WorkflowMemory())
    day10 = [(HELDOUT_8[i], calls) for i, (_, calls) in enumerate(tasks)]
    plan10, need10, hit10, misses10 = replay(day10, copy(day1_memory))
    named_10 = by_name[0]
    _, need10c, hit10c, _ = replay(day10, WorkflowMemory())
    print(f"\nretrieval recall, day 1 (the workflow's first {len(tasks)} tasks, memory "
          f"empty at the start, learning as they run): {hit1}/{need1} = "
          f"{100 * hit1 / need1:.1f}%")
    print(f"retrieval recall, day 2 (the same kinds of task in other words, other names and "
          f"places; memory of day 1): {hit}/{need} = {100 * hit / need:.1f}%")
    print(f"retrieval recall, day 3 (held out from the first round of scoring changes, seen "
          f"by the second; memory of day 1): {hit3}/{need3} = {100 * hit3 / need3:.1f}%")
    print(f"retrieval recall, day 3, memory empty (no learning from the workflow): "
          f"{hit3c}/{need3c} = {100 * hit3c / need3c:.1f}%")
    print(f"retrieval recall, day 4 HELD OUT from the second round of scoring changes (memory "
          f"of day 1): {hit4}/{need4} = {100 * hit4 / need4:.1f}%")
    print(f"retrieval recall, day 5 HELD OUT from the third round of scoring changes (memory "
          f"of day 1): {hit5}/{need5} = {100 * hit5 / need5:.1f}%")
    print(f"retrieval recall, day 5, memory empty: {hit5c}/{need5c} = "
          f"{100 * hit5c / need5c:.1f}%")
    print(f"retrieval recall, day 6 HELD OUT from the third round, first run after it was "
          f"fixed (memory of day 1): {hit6}/{need6} = {100 * hit6 / need6:.1f}%")
    print(f"retrieval recall, day 6, memory empty: {hit6c}/{need6c} = "
          f"{100 * hit6c / need6c:.1f}%")
    print(f"retrieval recall, day 7, written before the fourth round and held out from its "
          f"choice (its first run, the held-out figure, is in bench/results; memory of day 1): "
          f"{hit7}/{need7} = {100 * hit7 / need7:.1f}%")
    print(f"retrieval recall, day 7, memory empty: {hit7c}/{need7c} = "
          f"{100 * hit7c / need7c:.1f}%")
    print(f"retrieval recall, day 8, as day 7 (memory of day 1): {hit8}/{need8} = "
          f"{100 * hit8 / need8:.1f}%")
    print(f"retrieval recall, day 8, memory empty: {hit8c}/{need8c} = "
          f"{100 * hit8c / need8c:.1f}%")
    print(f"retrieval recall, day 9, written before the fifth round and held out from its "
          f"choice (memory of day 1): {hit9}/{need9} = {100 * hit9 / need9:.1f}%")
    print(f"retrieval recall, day 9, memory empty: {hit9c}/{need9c} = "
          f"{100 * hit9c / need9c:.1f}%")
    print(f"retrieval recall, day 10, written after day 9's first run and held out from the "
          f"change it suggested (memory of day 1): {hit10}/{need10} = "
          f"{100 * hit10 / need10:.1f}%")
    print(f"retrieval recall, day 10, memory empty: {hit10c}/{need10c} = "
          f"{100 * hit10c / need10c:.1f}%")
    h18 = hit1 + hit + hit3 + hit4 + hit5 + hit6 + hit7 + hit8
    n18 = need1 + need + need3 + need4 + need5 + need6 + need7 + need8
    print(f"retrieval recall, days 1-8 (memory of day 1 from day 2 on): {h18}/{n18} = "
          f"{100 * h18 / n18:.1f}%, of which {named_1_8} sent by name alone (in full or as "
          f"stubs: {100 * (h18 - named_1_8) / n18:.1f}%); by name alone day 9: {named_9}, "
          f"day 10: {named_10}")
    h, n = h18 + hit9 + hit10, n18 + need9 + need10
    print(f"retrieval recall, days 1-10: {h}/{n} = {100 * h / n:.1f}%")
    for day, missed in (("day 1", misses1), ("day 3", misses3), ("day 4", misses4),
                        ("day 5", misses5), ("day 6", misses6), ("day 7", misses7),
                        ("day 8", misses8), ("day 9", misses9), ("day 10", misses10)):
        for request, needed, sent, rank in missed:
            print(f"  {day} missed {needed} (scored {rank}th) for {request!r}: sent {sent}")
    for request, needed, sent, rank in misses:
        print(f"  day 2 missed {needed} (scored {rank}th) for {request!r}: sent {sent}")
    reasons = {}
    for _, _, sel, _ in plan:
        for why in sel.reasons.values():
            reasons[why] = reasons.get(why, 0) + 1
    print(f"day 2 tools sent, by reason: {reasons}")
    same = later = 0
    for (ti, _, sel, _), (tj, _, before, _) in zip(plan[1:], plan):
        if ti == tj:
            later += 1
            same += json.dumps(sel.sent) == json.dumps(before.sent)
    print(f"day 2 later turns that send the same tool block as the turn before: {same}/{later}")
    # a stub counts as sent for recall and its own tokens count here (as the ledger books)
    sent_tokens = [_tokens(sel.sent, counter) for _, _, sel, _ in plan]
    avg_sent = sum(sent_tokens) / len(sent_tokens)
    print(f"tool-definition tokens per turn: full {full_tokens}, retrieval {avg_sent:.0f} "
          f"(min {min(sent_tokens)}, max {max(sent_tokens)}) = "
          f"{100 * (1 - avg_sent / full_tokens):.1f}% fewer")
    for label, p in (("day 5", plan5), ("day 6", plan6), ("days 5 and 6", plan5 + plan6),
                     ("day 7", plan7), ("day 8", plan8), ("days 7 and 8", plan7 + plan8),
                     ("day 9", plan9), ("day 10", plan10)):
        toks = [_tokens(sel.sent, counter) for _, _, sel, _ in p]
        avg = sum(toks) / len(toks)
        print(f"tool-definition tokens per turn, {label} (held out): retrieval {avg:.0f} = "
              f"{100 * (1 - avg / full_tokens):.1f}% fewer")
    sel_ms.sort()
    print(f"selection time per turn (query embedding + ranking): p50 "
          f"{sel_ms[len(sel_ms) // 2]:.1f} ms, p95 {sel_ms[int(len(sel_ms) * .95)]:.1f} ms")
    print("\nk sweep (selection only, fresh memory per k: day 1, then days 2 and 3 on its "
          "memory; tokens over days 2 and 3):")
    for k in (2, 3, 4, 6, 8):
        memory = WorkflowMemory()
        args_k = args.k
        args.k = k
        _, n1, h1, _ = replay(tasks, memory)
        p3, n3, h3, _ = replay(day3, copy(memory))
        p2, n2, h2, _ = replay(day2, memory)
        args.k = args_k
        toks = sum(_tokens(sel.sent, counter) for _, _, sel, _ in p2 + p3) / len(p2 + p3)
        print(f"  k={k:<3} recall day 1 {100 * h1 / n1:5.1f}%  day 2 {100 * h2 / n2:5.1f}%  "
              f"day 3 {100 * h3 / n3:5.1f}%  tool tokens per turn {toks:5.0f} "
              f"({100 * (1 - toks / full_tokens):.1f}% fewer)")
    if args.no_engine:
        return 0

    import httpx
    from transformers import AutoTokenizer

    from app.engine.model import ensure_smollm2
    static = static_tokens(AutoTokenizer.from_pretrained(ensure_smollm2()))
    with tempfile.TemporaryDirectory() as tmp:
        eng = start_engine(Path(tmp))
        try:
            rows = {}
            for arm in ("full", "retrieval"):
                per_task: dict[int, list] = {}
                for ti, messages, sel, completion in plan:
                    body = {"model": "agent", "messages": messages, "max_tokens": 1,
                            "temperature": 0, "tool_choice": "none", "cache_salt": arm,
                            "tools": tools if arm == "full" else sel.sent}
                    r = httpx.post(f"{eng.url}/v1/chat/completions", json=body, timeout=300)
                    r.raise_for_status()
                    u = r.json()["usage"]
                    out = counter.count(completion)
                    per_task.setdefault(ti, []).append(
                        (u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"], out))
                rows[arm] = per_task
        finally:
            eng.stop()
    print(f"\nengine replay (reference engine, block size 16; static part = the "
          f"{static}-token system prompt before the tool block)")
    print(f"{'arm':<10} {'prompt/turn':>11} {'cached/turn':>11} {'hit rate':>8} "
          f"{'static hit':>10} {'computed/task':>13} {'tier-1 $/task':>13} "
          f"{'frontier $/task':>15}")
    summary = {}
    for arm, per_task in rows.items():
        reqs = [x for v in per_task.values() for x in v]
        prompt = sum(p for p, _, _ in reqs)
        cached = sum(c for _, c, _ in reqs)
        static_hit = sum(min(c, static) for _, c, _ in reqs) / (static * len(reqs))
        computed = (prompt - cached) / len(per_task)
        t1 = sum(cost(TIER1, p, c, o) for p, c, o in reqs) / len(per_task)
        fr = sum(cost(FRONTIER, p, c, o) for p, c, o in reqs) / len(per_task)
        summary[arm] = (prompt / len(reqs), t1, fr)
        from app.core.costing import format_usd
        print(f"{arm:<10} {prompt / len(reqs):>11.0f} {cached / len(reqs):>11.0f} "
              f"{100 * cached / prompt:>7.1f}% {100 * static_hit:>9.1f}% {computed:>13.0f} "
              f"{format_usd(t1):>13} {format_usd(fr):>15}")
    (pf, t1f, frf), (pr, t1r, frr) = summary["full"], summary["retrieval"]
    print(f"\nretrieval vs full: prompt tokens per turn {100 * (1 - pr / pf):.1f}% fewer; "
          f"cost per task {100 * (1 - float(t1r / t1f)):.1f}% lower at tier-1 prices, "
          f"{100 * (1 - float(frr / frf)):.1f}% lower at frontier prices")
    first = [v[0] for v in rows["retrieval"].values()]
    later = [x for v in rows["retrieval"].values() for x in v[1:]]
    print(f"retrieval arm: first turn of a task {sum(c for _, c, _ in first) / len(first):.0f} "
          f"cached tokens avg, later turns {100 * sum(c for _, c, _ in later) / max(1, sum(p for p, _, _ in later)):.1f}% "
          "of their prompt cached")
    return 0


if __name__ == "__main__":
    sys.exit(main())
