"""Offline evaluation of a trained adapter on its dataset's held-out traces.

The base model and base + adapter each answer every held-out prompt in-process
(transformers + peft, the chat template training used, greedy, left-padded batches of
``ADAPTERS_EVAL_BATCH``). A sample's budget is twice the reference answer's tokens plus
16, at most ``ADAPTERS_EVAL_MAX_NEW_TOKENS`` and at most the request's own ``max_tokens``
(recorded with the trace), so a rambling model is cut where a correct answer would long
have ended, and an answer the live path would cut is cut here too.

Concordance with the frontier's answer (``app.core.concordance``): for a request that
asked for JSON (``response_format`` json_object / json_schema), per-field exact match
after ``json.loads`` (a sample matches when every field is equal); for free text,
normalized exact match or token-level F1 >= 0.8. Wilson 95% intervals on both.
``latency_ms`` is the adapter's generation wall time per sample (batched, so amortized).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from app.core import concordance as conc

MAX_SAMPLES_SHOWN = 5


def device() -> str:
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_base(path: str | Path):
    """(tokenizer, model) of the base model on this machine's device (float32 on CPU,
    bfloat16 on a GPU), padding on the left for batched generation."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    dev = device()
    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32 if dev == "cpu" else torch.bfloat16).to(dev)
    return tok, model


def plain_messages(messages: list[dict]) -> list[dict]:
    """Messages with list contents (text parts) joined to strings, as chat templates want."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        out.append({"role": m.get("role", "user"), "content": content or ""})
    return out


def chat_prompt(tok, messages: list[dict]) -> str:
    """The prompt text the model answers (training and evaluation alike)."""
    return tok.apply_chat_template(plain_messages(messages), add_generation_prompt=True,
                                   tokenize=False)


def metric_of(record: dict) -> str:
    rf = record.get("response_format") or {}
    return conc.JSON_FIELDS if rf.get("type") in ("json_object", "json_schema") \
        else conc.TEXT_F1


def sample_budget(tok, record: dict, cap: int) -> int:
    """New tokens a held-out sample may take: twice the reference's plus 16, at most
    ``cap``, and never more than the request's own ``max_tokens`` (the live path stops
    there: an answer that needs more is cut, and fails, on tier 1 too)."""
    out = min(cap, 2 * len(tok.encode(record["answer"], add_special_tokens=False)) + 16)
    own = record.get("max_tokens")
    return min(out, own) if isinstance(own, int) and own > 0 else out


def generate(tok, model, records: list[dict], *, cap: int, batch: int
             ) -> tuple[list[str], list[int], float]:
    """(answers, generated token counts, seconds) for ``records``' prompts."""
    import torch
    answers: list[str] = []
    counts: list[int] = []
    started = time.perf_counter()
    eos = {tok.eos_token_id, tok.pad_token_id}
    for i in range(0, len(records), batch):
        chunk = records[i:i + batch]
        budgets = [sample_budget(tok, r, cap) for r in chunk]
        enc = tok([chat_prompt(tok, r["messages"]) for r in chunk], add_special_tokens=False,
                  padding=True, return_tensors="pt").to(model.device)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=max(budgets), do_sample=False,
                                 temperature=None, top_p=None, top_k=None,
                                 pad_token_id=tok.pad_token_id)
        for row, budget in zip(out[:, enc["input_ids"].shape[1]:].tolist(), budgets):
            ids = []
            for t in row[:budget]:
                if t in eos:
                    break
                ids.append(t)
            answers.append(tok.decode(ids, skip_special_tokens=True).strip())
            counts.append(len(ids))
    return answers, counts, time.perf_counter() - started


def _last_user(messages: list[dict]) -> str:
    texts = [m["content"] for m in plain_messages(messages) if m["role"] == "user"]
    return texts[-1] if texts else ""


def evaluate_offline(base_path: str | Path, adapter_dir: str | Path, heldout: list[dict], *,
                     cap: int = 256, batch: int = 16) -> dict[str, Any]:
    """``Adapter.offline`` for an adapter folder (what the task writes)."""
    from peft import PeftModel
    if not heldout:
        raise ValueError("no held-out traces to evaluate on")
    tok, base = load_base(base_path)
    model = PeftModel.from_pretrained(base, str(adapter_dir))
    model.eval()
    with model.disable_adapter():
        base_answers, base_tokens, _ = generate(tok, model, heldout, cap=cap, batch=batch)
    answers, tokens, seconds = generate(tok, model, heldout, cap=cap, batch=batch)
    metrics = [metric_of(r) for r in heldout]
    scored = [conc.sample_match(r["answer"], a, m) for r, a, m in zip(heldout, answers, metrics)]
    base_scored = [conc.sample_match(r["answer"], a, m)
                   for r, a, m in zip(heldout, base_answers, metrics)]
    ours = conc.concordance(m for _, m in scored)
    theirs = conc.concordance(m for _, m in base_scored)
    n = len(heldout)
    prompt_tokens = sum(len(tok.encode(chat_prompt(tok, r["messages"]), add_special_tokens=False))
                        for r in heldout) / n
    reference_tokens = sum(len(tok.encode(r["answer"], add_special_tokens=False))
                           for r in heldout) / n
    return {
        "n": n, "metric": max(set(metrics), key=metrics.count),
        "concordance": ours["concordance"], "ci_low": ours["ci_low"], "ci_high": ours["ci_high"],
        "base_concordance": theirs["concordance"], "base_ci_low": theirs["ci_low"],
        "base_ci_high": theirs["ci_high"],
        "score": sum(s for s, _ in scored) / n, "base_score": sum(s for s, _ in base_scored) / n,
        "latency_ms": round(seconds * 1000 / n, 2), "tokens": sum(tokens) / n,
        "base_tokens": sum(base_tokens) / n,
        "prompt_tokens": prompt_tokens, "reference_tokens": reference_tokens,
        "samples": [{"prompt": _last_user(r["messages"]), "reference": r["answer"],
                     "candidate": a, "base": b, "match": m}
                    for r, a, b, (_, m) in list(zip(heldout, answers, base_answers,
                                                    scored))[:MAX_SAMPLES_SHOWN]],
    }
