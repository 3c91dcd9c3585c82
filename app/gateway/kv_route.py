"""S03 with ``replica_choice: kv_events``: the prompt's index keys matched against the
Redis KV-block index the engines' own events keep (``app.contract.kv_index``), then
``app.core.kv_routing.kv_choice``.

The index keys are chained hashes of token ids (``app.core.kv_keys.block_hash_chain``
under ``key_namespace(adapter, cache_salt)``, KEY_TOKENS per key) that the subscriber
rebuilds from the token ids in each engine's ``BlockStored`` events, so the gateway needs
the ids the engine sees: it renders the same chat template with the pool model's own
tokenizer. Rendering is cheap; tokenizing is not, so the rendered text is cut at the
tokenizer's special tokens (which the tokenizer never merges across) and each piece's ids
are kept in an LRU: a tenant's system prompt and tool block, and every earlier turn of a
conversation, are tokenized once per gateway process. The keys of a recent prompt's
leading blocks are kept too (``ChainCache``), so only the blocks after them are hashed
(bench/kv_tokenize.py measures all three parts). The tokenizer loads off the event loop on
first use; until it is there, and whenever the index is stale or Redis is out, the choice
is today's rendezvous (telemetry ``replica_choice``: ``fallback``).
"""
from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from typing import Any

from app.contract import kv_index
from app.contract.tokenizers import chat_tokenizer
from app.core.kv_keys import KEY_TOKENS, ChainCache, key_namespace

log = logging.getLogger(__name__)

BLOCK_TOKENS = KEY_TOKENS  # the index's key size, whatever the engines' block size
PIECE_CACHE = 4096         # tokenized pieces kept per tokenizer


class PromptTokens:
    """A pool model's chat template + tokenizer, with the per-piece id cache."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        specials = sorted((t for t in tokenizer.get_added_vocab()), key=len, reverse=True)
        self.special_ids = {t: tokenizer.convert_tokens_to_ids(t) for t in specials}
        self.split = re.compile("(" + "|".join(map(re.escape, specials)) + ")") if specials \
            else None
        self.pieces: OrderedDict[str, list[int]] = OrderedDict()
        self.chains = ChainCache()     # index keys of recent prompts' leading blocks
        self.lock = threading.Lock()
        self.hits = self.misses = 0

    def _piece(self, text: str) -> list[int]:
        with self.lock:
            ids = self.pieces.get(text)
            if ids is not None:
                self.pieces.move_to_end(text)
                self.hits += 1
                return ids
        ids = self.tok.encode(text, add_special_tokens=False)
        with self.lock:
            self.misses += 1
            self.pieces[text] = ids
            if len(self.pieces) > PIECE_CACHE:
                self.pieces.popitem(last=False)
        return ids

    def encode(self, text: str) -> list[int]:
        if self.split is None:
            return self._piece(text)
        out: list[int] = []
        for part in self.split.split(text):
            if not part:
                continue
            sid = self.special_ids.get(part)
            out.extend([sid] if sid is not None else self._piece(part))
        return out

    def prompt_ids(self, body: dict) -> list[int]:
        """The engine's prompt ids for a chat body (``Engine.encode_chat``'s plain path)."""
        messages = []
        for m in body.get("messages") or []:
            m = dict(m)
            if isinstance(m.get("content"), list):
                m["content"] = "".join(p.get("text", "") for p in m["content"]
                                       if isinstance(p, dict))
            messages.append(m)
        tools = body.get("tools")
        kwargs = {"tools": tools} if tools else {}
        text = self.tok.apply_chat_template(messages, add_generation_prompt=True,
                                            tokenize=False, **kwargs)
        return self.encode(text)


_loaded: dict[str, PromptTokens | None] = {}
_loading: set[str] = set()
_lock = threading.Lock()


def prompt_tokens(model: str) -> PromptTokens | None:
    """The pool model's ``PromptTokens``, or None while it loads (in a thread) or when it
    cannot be loaded (logged once)."""
    got = _loaded.get(model)
    if got is not None or model in _loaded:
        return got
    with _lock:
        if model in _loading or model in _loaded:
            return _loaded.get(model)
        _loading.add(model)

    def load() -> None:
        try:
            value: PromptTokens | None = PromptTokens(chat_tokenizer(model))
        except Exception as exc:  # noqa: BLE001 - no tokenizer: rendezvous, said once
            log.warning("kv_events: no tokenizer for %s (%s); replica choice falls back",
                        model, exc)
            value = None
        with _lock:
            _loaded[model] = value
            _loading.discard(model)
    threading.Thread(target=load, name=f"tokenizer-{model}", daemon=True).start()
    return None


def request_chain(tokens: PromptTokens, body: dict, adapter: str | None, salt: str
                  ) -> tuple[list[bytes], int]:
    """(index keys of the blocks the engine would look up for this request, prompt
    tokens). ``adapter``: the LoRA adapter that serves it, None for the base model."""
    ids = tokens.prompt_ids(body)
    usable = (len(ids) - 1) // BLOCK_TOKENS * BLOCK_TOKENS   # the engine's lookup length
    return tokens.chains.chain(key_namespace(adapter, salt), ids[:usable]), len(ids)


async def matched_tokens(services, replica_ids: list, chain: list[bytes],
                         block_tokens: int = BLOCK_TOKENS) -> dict | None:
    """Matched prompt tokens per replica from the shared index; None when it is stale,
    empty of fresh replicas, or unreachable."""
    try:
        return await kv_index.read_matched_async(services.redis, services.keys, replica_ids,
                                                 chain, block_tokens)
    except Exception as exc:  # noqa: BLE001 - Redis out: the caller falls back
        log.debug("kv index unavailable: %s", exc)
        return None


async def routed_counts(services, replica_ids: list) -> dict | None:
    """Requests sent to each replica (every gateway's tally); None when Redis is out (the
    choice then keeps only the in-flight bound)."""
    try:
        return await kv_index.read_routed_async(services.redis, services.keys, replica_ids)
    except Exception as exc:  # noqa: BLE001 - Redis out: no balance term
        log.debug("kv routed tally unavailable: %s", exc)
        return None
