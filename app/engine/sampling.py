"""Token choice and OpenAI-format logprobs from one step's logits (plain tensors)."""
from __future__ import annotations

from typing import Callable

import torch


def choose_token(logits: torch.Tensor, temperature: float, top_p: float,
                 generator: torch.Generator | None) -> int:
    """``logits`` is 1-D (vocab). temperature 0 is greedy, as in vLLM."""
    if temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / temperature, dim=-1)
    if 0 < top_p < 1:
        sorted_p, idx = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, dim=-1) - sorted_p < top_p
        keep[0] = True
        probs = torch.zeros_like(probs).scatter_(0, idx[keep], sorted_p[keep])
    return int(torch.multinomial(probs, 1, generator=generator))


def logprob_entry(raw_logits: torch.Tensor, token_id: int, top_n: int,
                  decode: Callable[[int], str]) -> dict:
    """One ``choices[].logprobs.content[]`` item: the chosen token and the top-n
    alternatives, from the model's raw distribution (vLLM's default logprobs mode)."""
    logp = torch.log_softmax(raw_logits.float(), dim=-1)

    def item(tid: int) -> dict:
        text = decode(tid)
        return {"token": text, "logprob": max(float(logp[tid]), -9999.0),
                "bytes": list(text.encode("utf-8"))}

    entry = item(token_id)
    top = []
    if top_n > 0:
        values, ids = torch.topk(logp, top_n)
        top = [item(int(t)) for t in ids]
        del values
    entry["top_logprobs"] = top
    return entry


def find_stop(text: str, stops: list[str]) -> int:
    """Index of the earliest stop string in ``text``, or -1."""
    best = -1
    for s in stops:
        if s:
            i = text.find(s)
            if i != -1 and (best == -1 or i < best):
                best = i
    return best


def safe_emit_length(text: str, stops: list[str], finished: bool) -> int:
    """How much of ``text`` may be streamed now: hold back what could still become a
    stop string, and a trailing partial UTF-8 character."""
    if finished:
        return len(text)
    n = len(text)
    while n > 0 and text[n - 1] == "\ufffd":
        n -= 1
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, n), 0, -1):
            if text[:n].endswith(s[:k]):
                hold = max(hold, k)
                break
    return n - hold
