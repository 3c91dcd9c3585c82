"""The KV-block index's keys (S03 ``kv_events``). Pure.

The index cannot hold the engines' own block hashes: vLLM chains them from a seed of 32
random bytes per process (``NONE_HASH`` unless PYTHONHASHSEED is set) with, by default, a
sha256 over Python pickles, so no other process can compute them. Its keys are ours:
sha256 chained over KEY_TOKENS token ids at a time from ``key_namespace(adapter,
cache_salt)`` (``block_hash_chain``). The gateway computes them from a prompt's token ids
(``ChainCache`` keeps recent chains); ``BlockKeys`` rebuilds them from what an engine's
``BlockStored`` events carry (token ids, parent hash, LoRA name, the salt in the first
block's extra keys) and keeps the engine hash -> keys mapping that ``BlockRemoved`` needs.
"""
from __future__ import annotations

import hashlib
import threading
from array import array
from collections import OrderedDict
from typing import Hashable, Iterable, NamedTuple, Sequence

# The index's block granularity, whatever the engine's block size: the subscriber cuts the
# token ids of each engine's stored blocks into KEY_TOKENS pieces, so the gateway hashes a
# prompt one way for every pool (vLLM's CUDA default block size is 16 too).
KEY_TOKENS = 16
_FOLD = b"\xff"   # marks extra keys folded into a chain (images, prompt embeddings)


def key_namespace(adapter: str | None = None, cache_salt: str = "") -> str:
    """Where a request's chain of index keys starts: the LoRA adapter that serves it (None:
    the replica's base model; a replica serves one) and its ``cache_salt``. vLLM puts the
    adapter in every block's extra keys and the salt in the first block's, so both change
    every block of the chain there too."""
    return f"{adapter or ''}\x00{cache_salt}"


def chain_root(namespace: str) -> bytes:
    return hashlib.sha256(namespace.encode()).digest()


def _steps(prev: bytes, buf: bytes, out: list[bytes]) -> tuple[bytes, bytes]:
    """Chains every full KEY_TOKENS piece of ``buf`` (uint32 little-endian token ids) onto
    ``prev``, appending each digest to ``out``; returns (last digest, leftover bytes)."""
    step = KEY_TOKENS * 4
    n = len(buf) // step * step
    for start in range(0, n, step):
        prev = hashlib.sha256(prev + buf[start:start + step]).digest()
        out.append(prev)
    return prev, buf[n:]


def block_hash_chain(namespace: str, tokens: Sequence[int], block_size: int = KEY_TOKENS
                     ) -> list[bytes]:
    """Chained sha256 over each full block of token ids (parent digest + the ids as uint32
    little-endian), from sha256(namespace). With ``key_namespace`` and KEY_TOKENS it is the
    index's key chain: what the gateway computes from a prompt and what ``BlockKeys``
    rebuilds from an engine's events. The reference engine's prefix cache uses the same
    function under its own per-process seed for its internal block hashes."""
    out: list[bytes] = []
    prev = chain_root(namespace)
    n = len(tokens) // block_size * block_size
    buf = array("I", tokens[:n]).tobytes()          # uint32 little-endian per token id
    step = block_size * 4
    for start in range(0, n * 4, step):
        prev = hashlib.sha256(prev + buf[start:start + step]).digest()
        out.append(prev)
    return out


class ChainCache:
    """``block_hash_chain`` at KEY_TOKENS that keeps the chains of recent prompts: a prompt
    sharing leading blocks with one of them (its tenant's system prompt and tools, its
    conversation's earlier turns) hashes only the blocks after those. Chains are found by
    (namespace, first block); up to ``per_start`` per start, ``starts`` starts (LRU)."""

    def __init__(self, starts: int = 1024, per_start: int = 4) -> None:
        self.starts, self.per_start = starts, per_start
        self._chains: OrderedDict[tuple[str, bytes], list[tuple[bytes, tuple[bytes, ...]]]] = \
            OrderedDict()
        self._lock = threading.Lock()
        self.reused = self.hashed = 0

    def chain(self, namespace: str, tokens: Sequence[int]) -> list[bytes]:
        n = len(tokens) // KEY_TOKENS * KEY_TOKENS
        return self.chain_bytes(namespace, array("I", tokens[:n]).tobytes())

    def chain_bytes(self, namespace: str, ids: bytes) -> list[bytes]:
        """``chain`` of token ids given as uint32 bytes (a trailing part block is left
        out, as ``chain`` does)."""
        step = KEY_TOKENS * 4
        buf = ids[:len(ids) // step * step]
        if not buf:
            return []
        start = (namespace, buf[:step])
        with self._lock:
            known = list(self._chains.get(start, ()))
        best, shared = None, 0
        for cand in reversed(known):           # the most recent first
            if cand[0] == buf:                 # the same prompt again: nothing to hash or store
                with self._lock:
                    self.reused += len(cand[1])
                    if start in self._chains:
                        self._chains.move_to_end(start)
                return list(cand[1])
            if len(cand[0]) <= shared * step:
                continue
            if buf.startswith(cand[0]):        # the whole of it: no search, no copies
                best, shared = cand, len(cand[0]) // step
            elif cand[0][:(shared + 1) * step] == buf[:(shared + 1) * step]:
                best, shared = cand, _shared_blocks(cand[0], buf, step, shared + 1)
        out = list(best[1][:shared]) if best else []
        prev = out[-1] if out else chain_root(namespace)
        _steps(prev, buf[shared * step:], out)
        with self._lock:
            self.reused += shared
            self.hashed += len(out) - shared
            row = self._chains.setdefault(start, [])
            self._chains.move_to_end(start)
            # a chain this one extends (the same conversation, one turn on) is replaced
            row[:] = [c for c in row if not (len(c[0]) <= len(buf)
                                              and buf.startswith(c[0]))][-(self.per_start - 1):]
            row.append((buf, tuple(out)))   # kept apart from the list the caller gets
            while len(self._chains) > self.starts:
                self._chains.popitem(last=False)
        return out


def _shared_blocks(a: bytes, b: bytes, step: int, lo: int = 0) -> int:
    """Leading blocks of ``step`` bytes that ``a`` and ``b`` share, knowing they share
    ``lo`` (binary search)."""
    hi = min(len(a), len(b)) // step
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid * step] == b[:mid * step]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class KVEvent(NamedTuple):
    """One decoded vLLM KV event (``app.contract.kv_index.decode_batch``), whatever the
    wire version: fields a version lacks are None."""
    kind: str                                  # BlockStored | BlockRemoved | AllBlocksCleared
    block_hashes: tuple = ()
    parent_block_hash: Hashable | None = None
    token_ids: Sequence[int] = ()
    block_size: int | None = None
    lora_id: int | None = None
    lora_name: str | None = None
    medium: str | None = None
    extra_keys: Sequence | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None


def _split_extra(keys, lora_name: str | None, lora_id: int | None,
                 first: bool) -> tuple[str, list]:
    """A block's vLLM extra keys -> (cache salt, keys the gateway cannot reproduce). vLLM
    orders them LoRA (name; an int id before lora_name existed), multimodal identifiers,
    the cache salt (first block only), prompt-embedding digests."""
    rest = list(keys or ())
    if rest and ((lora_name is not None and rest[0] == lora_name)
                 or (lora_id is not None and rest[0] == lora_id)):
        rest.pop(0)
    salt = ""
    if first:
        for i in range(len(rest) - 1, -1, -1):
            if isinstance(rest[i], str):
                salt = rest.pop(i)
                break
    return salt, rest


class BlockKeys:
    """One replica's engine block hashes -> index keys, rebuilt from its own events.

    vLLM's block hashes cannot be computed outside the engine process: the chain starts
    from ``NONE_HASH``, 32 random bytes per process unless PYTHONHASHSEED is set, and the
    default ``sha256`` pickles Python objects. So the index never stores them: every
    ``BlockStored`` carries the token ids of the blocks it stores, their parent's hash,
    the LoRA name and (vLLM since the ``extra_keys`` field) the cache salt, and this class
    chains those ids with ``block_hash_chain``'s hash from ``key_namespace(lora, salt)``,
    continuing from the parent's digest it kept. ``BlockRemoved`` names engine hashes
    only; the kept mapping turns them into index keys. A block whose parent was stored
    before this mapping began (the subscriber joined late) cannot be placed: it is
    counted in ``orphans`` and skipped. A block with extra keys the gateway cannot
    reproduce (images, prompt embeddings) gets a chain no prompt's text reaches.

    Only GPU blocks of one KV-cache group are followed (the first full-attention group a
    store names; events without a group count as it)."""

    RECENT = 16_384       # translations of removed blocks kept (a child may name one)

    def __init__(self) -> None:
        # engine hash -> (digest at the last KEY_TOKENS boundary, leftover token bytes,
        # the index keys this block completes)
        self.live: dict[Hashable, tuple[bytes, bytes, tuple[bytes, ...]]] = {}
        self.recent: OrderedDict[Hashable, tuple[bytes, bytes, tuple[bytes, ...]]] = \
            OrderedDict()
        self.holders: dict[bytes, int] = {}     # index key -> live engine blocks giving it
        self.group: Hashable | None = None
        self.orphans = 0

    def apply(self, events: Iterable[KVEvent]) -> list[tuple[str, list[bytes]]]:
        """Events in stream order -> the index changes they make, ``(kind, index keys)``
        with kind ``BlockStored`` (now held), ``BlockRemoved`` (no longer held) or
        ``AllBlocksCleared`` (``app.contract.kv_index.apply_events`` takes them)."""
        out: list[tuple[str, list[bytes]]] = []
        for ev in events:
            if ev.kind == "AllBlocksCleared":
                self.reset()
                out.append(("AllBlocksCleared", []))
                continue
            if ev.medium not in (None, "GPU") or not self._followed(ev):
                continue
            if ev.kind == "BlockStored":
                got = self._stored(ev)
            elif ev.kind == "BlockRemoved":
                got = self._removed(ev.block_hashes)
            else:
                continue
            if got:
                out.append((ev.kind, got))
        return out

    def reset(self) -> None:
        """The engine holds nothing (cleared, or a new process whose hashes are new)."""
        self.live.clear()
        self.recent.clear()
        self.holders.clear()

    def forget_held(self) -> None:
        """The index was dropped (a gap not replayed): nothing is known held any more, but
        the translations stay valid for this engine process, so children of blocks
        stored before the gap can still be placed."""
        for h, entry in self.live.items():
            self._remember(h, entry)
        self.live.clear()
        self.holders.clear()

    def _followed(self, ev: KVEvent) -> bool:
        if ev.group_idx is None:
            return True
        if self.group is None:
            if ev.kind != "BlockStored" or ev.kv_cache_spec_kind not in (None,
                                                                         "full_attention"):
                return False
            self.group = ev.group_idx
        return ev.group_idx == self.group

    def _remember(self, h: Hashable, entry: tuple) -> None:
        self.recent[h] = entry
        self.recent.move_to_end(h)
        while len(self.recent) > self.RECENT:
            self.recent.popitem(last=False)

    def _stored(self, ev: KVEvent) -> list[bytes]:
        hashes = list(ev.block_hashes)
        if not hashes:
            return []
        size = ev.block_size or len(ev.token_ids) // len(hashes)
        extras = list(ev.extra_keys) if ev.extra_keys else []
        if ev.parent_block_hash is None:
            salt, _ = _split_extra(extras[0] if extras else None, ev.lora_name, ev.lora_id,
                                   True)
            adapter = (ev.lora_name if ev.lora_name is not None else
                       f"lora#{ev.lora_id}" if ev.lora_id is not None else None)
            digest, pending = chain_root(key_namespace(adapter, salt)), b""
        else:
            entry = (self.live.get(ev.parent_block_hash)
                     or self.recent.get(ev.parent_block_hash))
            if entry is None:
                self.orphans += len(hashes)
                return []
            digest, pending = entry[0], entry[1]
        buf = array("I", ev.token_ids).tobytes()
        step = size * 4
        new: list[bytes] = []
        for i, h in enumerate(hashes):
            _, other = _split_extra(extras[i] if i < len(extras) else None, ev.lora_name,
                                    ev.lora_id, ev.parent_block_hash is None and i == 0)
            if other:
                digest = hashlib.sha256(digest + _FOLD + repr(other).encode()).digest()
            ids: list[bytes] = []
            digest, pending = _steps(digest, pending + buf[i * step:(i + 1) * step], ids)
            entry = (digest, pending, tuple(d[:8] for d in ids))
            if h in self.live:           # another copy of a block already held
                continue
            self.recent.pop(h, None)
            self.live[h] = entry
            for key in entry[2]:
                n = self.holders.get(key, 0)
                self.holders[key] = n + 1
                if n == 0:
                    new.append(key)
        return new

    def _removed(self, hashes: Iterable[Hashable]) -> list[bytes]:
        gone: list[bytes] = []
        for h in hashes:
            entry = self.live.pop(h, None)
            if entry is None:
                continue
            self._remember(h, entry)
            for key in entry[2]:
                n = self.holders.get(key, 0) - 1
                if n > 0:
                    self.holders[key] = n
                else:
                    self.holders.pop(key, None)
                    gone.append(key)
        return gone
