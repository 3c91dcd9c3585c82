"""Can tier 1 learn the replayed month's workflows at all? The steady-state ceiling of
bench/replay.py's cut on these CPU stand-ins.

bench/replay.py replays one month from a cold start: the flywheel (traces -> training ->
shadow -> approval -> exploration labels -> router) takes most of that month, so its cut
mixes two questions. This bench answers the one the month cannot: with enough traces and
no clock, does the tier-1 stand-in (SmolLM2-135M-Instruct + a LoRA, on CPU) answer each
workflow as the frontier does?

Per workflow category of the month's generator (bench/replay_traffic.py, all tenants'
first turns pooled, as many traces as ``--train`` and ``--heldout`` ask; stated):
- the product's training code (``app.adapters.training.fit_lora``) with the flywheel
  bench's hyperparameters (rank 8, alpha 16, lr 1e-3, 2 epochs, batch 4) and a
  ``max_seq_len`` that fits the category's longest prompt (up to ``--max-seq-len``; a
  contract is ~1.1k SmolLM2 tokens, over the 512 bench/replay_flywheel.py uses);
- the product's offline evaluation (``app.adapters.evaluation``: base and base + adapter,
  greedy, its token budget, the concordance rule of the shadow gate) on held-out traces,
  and the month's validator (``replay_traffic.validate``) on every answer, as the replay
  judges quality;
- traces frozen as the product freezes them for training (``app.adapters.served_form``:
  JSON workflows with S02's aliases and compact separators, the product's default policy),
  the validator judging each answer with the client's keys back; and the frontier answer's
  SmolLM2 tokens in that form against the request's ``max_tokens``.

Then the ceiling: the month's all-frontier cost per category (o200k tokens, as the gold
server bills; tier-3 seed price), the share its exact and paraphrase repeats leave to the
cache, and what the rest would cost on tier 1 (seed price $0.06 vs $3.50 per 1M) for the
categories whose adapter reached 99% of the frontier's validator pass rate. That is the
cut a month would reach if every learnable workflow were on tier 1 from its first day and
the cache were perfect; the cold-start month of bench/replay.py cannot beat it.

    .venv/bin/python bench/replay_distill.py [--train 48] [--heldout 16] [--n 600]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import replay_traffic as traffic  # noqa: E402
from replay_gold import shaped  # noqa: E402

from app.adapters.served_form import to_served  # noqa: E402
from app.contract.policy import DEFAULTS  # noqa: E402
from app.contract.tokenizers import SMOLLM2  # noqa: E402
from app.adapters.evaluation import chat_prompt, generate, load_base, metric_of  # noqa: E402
from app.core import concordance as conc  # noqa: E402
from app.adapters.training import DEFAULT_HYPERPARAMS, fit_lora  # noqa: E402
from app.commands import SEED_TIERS  # noqa: E402
from app.contract.tokenizers import count_tokens  # noqa: E402
from app.engine.model import ensure_smollm2  # noqa: E402

HP = {"rank": 8, "alpha": 16, "lr": 1e-3, "epochs": 2, "batch_size": 4}
PRICE = {t["rank"]: t["price"] for t in SEED_TIERS}


def record(req: dict, i: int) -> dict:
    """A trace as the gateway captures it (the client's messages, the frontier's answer),
    frozen in the form tier 1 is served in, as the product freezes it
    (``app.adapters.served_form``, product default policy, SmolLM2's tokenizer)."""
    messages = [{"role": "system", "content": req["system"]},
                {"role": "user", "content": req["user"]}]
    rec = {"request_id": f"distill_{req['category']}_{i:05d}", "messages": messages,
           "response_format": req["response_format"],
           "answer": shaped(req["gold"], req["response_format"])}
    return {**to_served(rec, DEFAULTS, SMOLLM2), "req": req}


def client_answer(rec: dict, answer: str) -> str:
    """An answer in the served form with the client's keys back (what S05 does)."""
    if "served_form" not in rec:
        return answer
    from app.contract.tokenizers import get_counter
    from app.core.minify import MinifyOptions, expand_text, minify_response_format
    _, keymap = minify_response_format(rec["req"]["response_format"],
                                       tokenizer=get_counter(SMOLLM2),
                                       options=MinifyOptions(alias_style="semantic"))
    return expand_text(answer, keymap)[0]


def pool_by_category(n_month: int, want: int, seed: int) -> dict[str, list[dict]]:
    """``want`` distinct first turns per category from as many generated months as it
    takes (seeds ``seed``, ``seed``+1, ...)."""
    out: dict[str, list[dict]] = {c: [] for c in traffic.WORKFLOWS}
    seen: set[tuple[str, str, str]] = set()
    s = seed
    while any(len(v) < want for v in out.values()) and s < seed + 50:
        for req in traffic.generate(n_month, seed=s).requests:
            key = (req["category"], req["system"], req["user"])
            if req.get("turn", 1) != 1 or key in seen or len(out[req["category"]]) >= want:
                continue
            seen.add(key)
            out[req["category"]].append(record(req, len(out[req["category"]])))
        s += 1
    return out


def month_costs(n: int, seed: int) -> dict[str, dict]:
    """Per category of one month: requests, all-frontier cost, the part its repeats
    (exact or paraphrase first turns) leave to the cache."""
    out: dict[str, dict] = {}
    for req in traffic.generate(n, seed=seed).requests:
        c = out.setdefault(req["category"], {"requests": 0, "cost": Decimal(0),
                                             "repeat_cost": Decimal(0)})
        prompt = sum(count_tokens(t, "o200k_base") + 4 for t in (req["system"], req["user"]))
        answer = shaped(req["gold"], req["response_format"])
        cost = Decimal(prompt + count_tokens(answer, "o200k_base")) * PRICE[3] / 1_000_000
        c["requests"] += 1
        c["cost"] += cost
        if req.get("repeat") in ("exact", "paraphrase"):
            c["repeat_cost"] += cost
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", type=int, default=48, help="training traces per category")
    ap.add_argument("--heldout", type=int, default=16, help="held-out traces per category")
    ap.add_argument("--n", type=int, default=600, help="requests in the month costed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-seq-len", type=int, default=1536)
    ap.add_argument("--categories", default=",".join(traffic.WORKFLOWS))
    args = ap.parse_args()
    import torch
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    model = ensure_smollm2()
    tok, _ = load_base(str(model))
    cats = [c for c in args.categories.split(",") if c]
    pools = pool_by_category(args.n, args.train + args.heldout, args.seed + 1000)

    print(__doc__.split("\n\n")[0].replace("\n", " ") + "\n")
    print(f"model {model.name} on {torch.get_num_threads()} CPU threads; per category "
          f"{args.train} training + {args.heldout} held-out first turns (distinct, generator "
          f"seeds from {args.seed + 1000}, not the costed month's); hyperparameters {HP}")
    results: dict[str, dict] = {}
    for cat in cats:
        rows = pools[cat]
        train, held = rows[:args.train], rows[args.train:args.train + args.heldout]
        longest = max(len(tok.encode(chat_prompt(tok, r["messages"]) + r["answer"],
                                     add_special_tokens=False)) for r in rows) + 8
        hp = {**DEFAULT_HYPERPARAMS, **HP, "max_seq_len": min(args.max_seq_len, longest)}
        ans_tokens = [len(tok.encode(r["answer"], add_special_tokens=False)) for r in rows]
        max_tokens = traffic.MAX_TOKENS[cat]
        with tempfile.TemporaryDirectory(prefix="distill-") as tmp:
            out = Path(tmp) / "adapter"
            out.mkdir()
            t0 = time.perf_counter()
            fit = fit_lora(str(model), train, hp, out)
            train_s = time.perf_counter() - t0
            # what evaluate_offline does (the same generate, the same concordance rule),
            # keeping every answer for the month's validator
            t0 = time.perf_counter()
            from peft import PeftModel
            tk, base = load_base(str(model))
            lora = PeftModel.from_pretrained(base, str(out))
            lora.eval()
            answers, _, _ = generate(tk, lora, held, cap=256, batch=8)
            with lora.disable_adapter():
                base_answers, _, _ = generate(tk, lora, held, cap=256, batch=8)
            eval_s = time.perf_counter() - t0
        metrics = [metric_of(r) for r in held]
        off = conc.concordance(conc.sample_match(r["answer"], a, m)[1]
                               for r, a, m in zip(held, answers, metrics))
        base_off = conc.concordance(conc.sample_match(r["answer"], a, m)[1]
                                    for r, a, m in zip(held, base_answers, metrics))
        passed = sum(traffic.validate(r["req"], client_answer(r, a))
                     for r, a in zip(held, answers))
        base_passed = sum(traffic.validate(r["req"], client_answer(r, a))
                          for r, a in zip(held, base_answers))
        gold_passed = sum(traffic.validate(r["req"], client_answer(r, r["answer"]))
                          for r in held)
        results[cat] = {"passed": passed, "base_passed": base_passed, "gold": gold_passed,
                        "n": len(held), "conc": off["concordance"],
                        "base_conc": base_off["concordance"]}
        over = sum(t > max_tokens for t in ans_tokens)
        print(f"\n{cat} ({traffic.WORKFLOWS[cat]}): trained {fit['steps']} steps on "
              f"{len(train)} traces in {train_s:.0f} s (max_seq_len {hp['max_seq_len']}, "
              f"loss {fit['final_loss']}); evaluated in {eval_s:.0f} s")
        print(f"  held out n={len(held)}: validator pass adapter {passed}/{len(held)}, base "
              f"{base_passed}/{len(held)}, frontier answer {gold_passed}/{len(held)}; "
              f"shadow-rule concordance adapter {off['concordance']:.0%} "
              f"(95% {off['ci_low']:.0%}-{off['ci_high']:.0%}), base {base_off['concordance']:.0%}")
        form = "served form (aliases, compact)" if "served_form" in rows[0] else "form sent"
        print(f"  frontier answers {min(ans_tokens)}-{max(ans_tokens)} SmolLM2 tokens in the "
              f"{form}; request max_tokens {max_tokens} ({over} of {len(rows)} over)")
        for r, a in list(zip(held, answers))[:2]:
            print(f"    e.g. gold {r['answer'][:70]!r} -> adapter {a[:70]!r}")

    costs = month_costs(args.n, args.seed)
    total = sum(c["cost"] for c in costs.values())
    ratio = PRICE[1] / PRICE[3]
    print(f"\nCeiling on the costed month (n={args.n}, seed {args.seed}: bench/replay.py's month; "
          f"all-frontier ${total:.6f} at o200k tokens):")
    print(f"  {'category':15} {'req':>4} {'share':>6} {'repeats':>8} {'learnable':>9} "
          f"{'cut of its cost':>15}")
    cut = Decimal(0)
    for cat, c in sorted(costs.items(), key=lambda kv: -kv[1]["cost"]):
        r = results.get(cat)
        ok = bool(r) and r["gold"] > 0 and r["passed"] >= Decimal("0.99") * r["gold"]
        rest = c["cost"] - c["repeat_cost"]
        saved = c["repeat_cost"] + (rest * (1 - ratio) if ok else 0)
        cut += saved
        learn = "-" if r is None else ("yes" if ok else "no") + f" {r['passed']}/{r['n']}"
        print(f"  {cat:15} {c['requests']:4d} {float(c['cost'] / total):6.1%} "
              f"{float(c['repeat_cost'] / c['cost']):8.1%} {learn:>9} "
              f"{float(saved / c['cost']):15.1%}")
    print(f"  ceiling cut {float(cut / total):.1%} (every repeat a cache hit; every learnable "
          f"category on tier 1 at ${PRICE[1]} vs ${PRICE[3]} per 1M from its first request; "
          f"the rest on the frontier)")
    print(json.dumps({"ceiling_cut": round(float(cut / total), 4),
                      "learnable": {k: v for k, v in results.items()}}, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
