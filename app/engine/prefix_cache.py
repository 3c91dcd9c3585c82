"""Block-granular prefix cache of attention KV, bounded by a token budget (LRU).

A prompt's tokens are cut into blocks of ``block_size``; block j is named by a hash
chain over the namespace (model or adapter, cache salt) and tokens[0 : (j+1)*B], as
vLLM's automatic prefix caching does. An entry holds the per-layer KV of one prompt's
block-aligned prefix; any later prompt that shares the first j blocks reuses the first
j*B positions of that entry.

The chain starts from a per-process seed, as vLLM's does (``NONE_HASH``: 32 random bytes,
or derived from PYTHONHASHSEED when it is set), so block hashes mean nothing outside this
process. With ``events`` (``app.engine.kv_events.CacheEvents``) the cache publishes its
block changes as vLLM's KV events: the blocks it starts to hold with their token ids
(``BlockStored``), the ones it no longer holds (``BlockRemoved``) and a clear
(``AllBlocksCleared``); the KV-event subscriber rebuilds the index's own keys from the
token ids (``app.core.kv_keys.BlockKeys``), exactly as it does for vLLM.
"""
from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Sequence

from app.core.kv_keys import block_hash_chain as block_hashes

KV = list[tuple[Any, Any]]  # per layer (keys, values), shape [1, heads, seq, head_dim]


@dataclass
class _Entry:
    tokens: int
    kv: KV
    hashes: list[bytes] = field(default_factory=list)


class PrefixCache:
    def __init__(self, max_tokens: int, block_size: int = 16, events: Any = None) -> None:
        self.max_tokens = max(0, int(max_tokens))
        self.block_size = block_size
        self.events = events
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._by_hash: dict[bytes, int] = {}
        self._next_id = 0
        self.tokens = 0
        seed = os.environ.get("PYTHONHASHSEED")
        self.seed = (hashlib.sha256(seed.encode()).hexdigest() if seed is not None
                     else os.urandom(32).hex())

    def _hashes(self, namespace: str, tokens: Sequence[int]) -> list[bytes]:
        return block_hashes(f"{self.seed}\x00{namespace}", tokens, self.block_size)

    @property
    def usage(self) -> float:
        return self.tokens / self.max_tokens if self.max_tokens else 0.0

    def lookup(self, namespace: str, tokens: Sequence[int]) -> tuple[int, KV | None]:
        """Longest cached block-aligned prefix, leaving at least one token to compute
        (the model needs the last prompt position's logits). Returns (length, kv)."""
        usable = (len(tokens) - 1) // self.block_size
        hashes = self._hashes(namespace, tokens[:usable * self.block_size])
        for j in range(len(hashes), 0, -1):
            entry_id = self._by_hash.get(hashes[j - 1])
            if entry_id is None:
                continue
            entry = self._entries[entry_id]
            self._entries.move_to_end(entry_id)
            n = j * self.block_size
            return n, [(k[:, :, :n], v[:, :, :n]) for k, v in entry.kv]
        return 0, None

    def insert(self, namespace: str, tokens: Sequence[int], kv: KV) -> int:
        """Keep the block-aligned prefix of ``tokens`` whose KV is ``kv``; returns the
        number of tokens now held for it (0 when it does not fit the budget)."""
        n = (len(tokens) // self.block_size) * self.block_size
        if n == 0 or n > self.max_tokens:
            return 0
        hashes = self._hashes(namespace, tokens[:n])
        known = self._by_hash.get(hashes[-1])
        if known is not None:
            self._entries.move_to_end(known)
            return n
        removed: list[bytes] = []
        while self.tokens + n > self.max_tokens and self._entries:
            removed += self._evict_oldest()
        entry_id = self._next_id
        self._next_id += 1
        self._entries[entry_id] = _Entry(n, [(k[:, :, :n], v[:, :, :n]) for k, v in kv], hashes)
        new = [h not in self._by_hash for h in hashes]
        for h in hashes:
            self._by_hash[h] = entry_id
        self.tokens += n
        if self.events is not None:
            self._publish(namespace, tokens, hashes, new, removed)
        return n

    def _publish(self, namespace: str, tokens: Sequence[int], hashes: list[bytes],
                 new: list[bool], removed: list[bytes]) -> None:
        # runs of consecutive new blocks, each with the block before it as parent
        runs, j, b = [], 0, self.block_size
        while j < len(hashes):
            if not new[j]:
                j += 1
                continue
            start = j
            while j < len(hashes) and new[j]:
                j += 1
            runs.append((hashes[start - 1] if start else None, hashes[start:j],
                         [int(t) for t in tokens[start * b:j * b]]))
        stored = set(hashes)
        gone = [h for h in removed if h not in stored]
        model, _, salt = namespace.partition("\x00")
        self.events.publish(self.events.removed(gone) + self.events.stored(runs, model, salt))

    def clear(self) -> None:
        """Forget everything (an adapter unload makes its KV stale; unloads are rare)."""
        self._entries.clear()
        self._by_hash.clear()
        self.tokens = 0
        if self.events is not None:
            self.events.cleared()

    def _evict_oldest(self) -> list[bytes]:
        """Drops the least recent entry; returns the block hashes no longer held."""
        entry_id, entry = self._entries.popitem(last=False)
        gone = []
        for h in entry.hashes:
            if self._by_hash.get(h) == entry_id:
                del self._by_hash[h]
                gone.append(h)
        self.tokens -= entry.tokens
        return gone
