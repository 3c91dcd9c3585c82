"""What S03 ``kv_events`` pays per request to name the prompt's blocks, at concurrency 1.

    .venv/bin/python bench/kv_tokenize.py [--requests 400] [--system-words 1200]

The gateway renders the pool model's chat template, tokenizes it (``app.gateway.kv_route.
PromptTokens``: the text is cut at special tokens and each piece's ids are kept in an LRU)
and chains the ids into index keys (``app.core.kv_keys.ChainCache``: the step each piece
took is kept, so only new pieces are hashed; given a whole prompt's ids as one piece, as
the "hash" column does, it reuses only an exact repeat). Timed here, one request after another in one thread,
with SmolLM2's tokenizer (the pool model the tests and benches serve), split into
template render, tokenize and hash (and the hash without the chain cache, for reference):

- ``cold``: empty caches per request (what tokenizing and hashing every prompt costs);
- ``new-conversation``: one tenant's long system prompt, a new user message each time
  (the static prefix comes from the piece cache);
- ``multi-turn``: a conversation growing by a turn per request (earlier turns cached), a
  new one after 15 turns.

Prints p50 / p99 in ms per part and in total, then the gateway's own path for the same
requests (``request_chain`` on a PromptTokens of its own: a plain conversation's pieces are
joined from its role sequence's plan instead of rendering and cutting the whole text), and
the prompt's tokens.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from app.contract.tokenizers import chat_tokenizer  # noqa: E402
from app.core.kv_keys import KEY_TOKENS, ChainCache, block_hash_chain, key_namespace  # noqa: E402
from app.gateway.kv_route import PromptTokens, request_chain  # noqa: E402

WORDS = ("invoice ledger tenant refund policy escalate customer order shipment account "
         "balance review approve reject summary cite ticket priority region contract").split()


def _text(n: int, seed: int) -> str:
    return " ".join(WORDS[(seed * 7 + i * 13 + i // 5) % len(WORDS)] for i in range(n))


def _emptied(tokens: PromptTokens) -> PromptTokens:
    """``tokens`` with nothing cached (the tokenizer stays loaded, as in a running gateway)."""
    tokens.pieces.clear()
    tokens.skeletons.clear()
    tokens.plans.clear()
    tokens.chains = ChainCache()
    return tokens


def _gateway(tokens: PromptTokens, body: dict) -> float:
    """The gateway's own path (``request_chain``: a plain conversation's pieces joined from
    its role sequence's plan, new pieces tokenized, the chain from the chain cache)."""
    t0 = time.perf_counter()
    request_chain(tokens, body, None, "tenant-a")
    return time.perf_counter() - t0


def _timed(tokens: PromptTokens, body: dict) -> tuple[float, ...]:
    t0 = time.perf_counter()
    msgs = [dict(m) for m in body["messages"]]
    text = tokens.tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    t1 = time.perf_counter()
    ids = tokens.encode(text)
    t2 = time.perf_counter()
    usable = (len(ids) - 1) // KEY_TOKENS * KEY_TOKENS
    got = tokens.chains.chain(key_namespace(None, "tenant-a"), ids[:usable])
    t3 = time.perf_counter()
    plain = block_hash_chain(key_namespace(None, "tenant-a"), ids[:usable], KEY_TOKENS)
    t4 = time.perf_counter()
    assert got == plain
    return t1 - t0, t2 - t1, t3 - t2, t4 - t3, len(ids)


def _row(name: str, rows: list[tuple[float, ...]]) -> str:
    def pct(xs: list[float], q: float) -> float:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000
    parts = list(zip(*rows))
    total = [r[0] + r[1] + r[2] for r in rows]
    cells = [f"{pct(list(p), .5):6.3f}/{pct(list(p), .99):6.3f}" for p in parts[:4]]
    gw = f"{pct(list(parts[5]), .5):6.3f}/{pct(list(parts[5]), .99):6.3f}"
    return (f"{name:17s} {cells[0]:>13s} {cells[1]:>13s} {cells[2]:>13s} "
            f"{pct(total, .5):6.3f}/{pct(total, .99):6.3f} {cells[3]:>13s} {gw:>13s} "
            f"{int(statistics.median(parts[4])):6d}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--system-words", type=int, default=1200)
    args = ap.parse_args()
    tok = chat_tokenizer("smollm2")
    system = {"role": "system", "content": _text(args.system_words, 1)}
    warm, empty = PromptTokens(tok), PromptTokens(tok)
    gw_warm, gw_empty = PromptTokens(tok), PromptTokens(tok)
    out: dict[str, list] = {"cold": [], "new-conversation": [], "multi-turn": []}
    turns: list[dict] = [system]
    for i in range(args.requests + 20):
        user = {"role": "user", "content": f"Request {i}: " + _text(40, i)}
        body = {"messages": [system, user]}
        cold = _timed(_emptied(empty), body) + (_gateway(_emptied(gw_empty), body),)
        fresh = _timed(warm, body) + (_gateway(gw_warm, body),)
        if len(turns) > 30:                             # 15 turns, then a new one
            turns = [system]
        turns = turns + [user]
        multi = _timed(warm, {"messages": turns}) + (_gateway(gw_warm, {"messages": turns}),)
        turns.append({"role": "assistant", "content": _text(30, i + 1)})
        if i >= 20:                                     # after warm-up
            out["cold"].append(cold)
            out["new-conversation"].append(fresh)
            out["multi-turn"].append(multi)
    print(f"tokenizer smollm2, {args.requests} requests each, concurrency 1, "
          f"system prompt {args.system_words} words; ms p50/p99")
    print(f"{'case':17s} {'render':>13s} {'tokenize':>13s} {'hash':>13s} "
          f"{'total':>13s} {'(hash, no':>13s} {'gateway':>13s} {'tokens':>6s}")
    print(f"{'':17s} {'':>13s} {'':>13s} {'':>13s} {'':>13s} {'ChainCache)':>13s} "
          f"{'path':>13s}")
    for name, rows in out.items():
        print(_row(name, rows))
    print(f"piece cache: {warm.hits} hits, {warm.misses} misses; chain cache: "
          f"{warm.chains.reused} keys reused, {warm.chains.hashed} hashed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
