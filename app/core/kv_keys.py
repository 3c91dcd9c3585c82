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
from collections import OrderedDict, deque
from typing import Hashable, Iterable, NamedTuple, Sequence

# The index's block granularity, whatever the engine's block size: the subscriber cuts the
# token ids of each engine's stored blocks into KEY_TOKENS pieces, so the gateway hashes a
# prompt one way for every pool (vLLM's CUDA default block size is 16 too).
KEY_TOKENS = 16
_FOLD = b"\xff"   # marks extra keys folded into a chain (images, prompt embeddings)
# The KV-block index names a key by its first ID_BYTES bytes (``kv_index.block_id``).
ID_BYTES = 8


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


class _Step:
    """A chain's state after a run of parts: the keys the last part completed, the last
    digest, the ids past the last full block, and the steps that follow by next part.
    ``ids``: the keys' index names (``ID_BYTES`` each) joined, what the gateway sends."""
    __slots__ = ("keys", "ids", "digest", "left", "next", "parent", "part")

    def __init__(self, keys: tuple, digest: bytes, left: bytes, parent: "_Step | None",
                 part: bytes) -> None:
        self.keys, self.digest, self.left = keys, digest, left
        self.ids = b"".join([k[:ID_BYTES] for k in keys])
        self.next: dict[bytes, _Step] = {}
        self.parent, self.part = parent, part


class ChainCache:
    """``block_hash_chain`` at KEY_TOKENS over a prompt given as its parts (byte strings of
    uint32 token ids, in order: a tenant's system prompt, its tool block, each earlier turn,
    the special tokens between them), keeping the step each part took from the chain's
    state before it (a tree per namespace: a step holds the keys its part completed, the
    last digest and the ids left over past the last full block). A prompt whose leading
    parts were seen in that order (its tenant's system prompt and tools, its
    conversation's earlier turns) costs a dict lookup per part (the parts are the piece
    cache's own objects, whose hash Python keeps); only its new parts are hashed, and no
    part is compared or copied whole. The oldest steps go past ``max_bytes`` (the parts
    they hold, and their keys).

    ``chain(namespace, tokens)`` takes the ids as one part: an exact repeat reuses it.
    ``chain_ids`` gives the same chain as its keys' index names joined (the gateway's route
    call sends them so: a join per part, not a slice per key)."""

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._roots: dict[str, _Step] = {}
        self._made: deque[_Step] = deque()        # every step, oldest first
        self._lock = threading.Lock()
        self.reused = self.hashed = 0

    def chain(self, namespace: str, tokens: Sequence[int]) -> list[bytes]:
        return self.chain_parts(namespace, [array("I", tokens).tobytes()])[0]

    def chain_parts(self, namespace: str, parts: Iterable[bytes]) -> tuple[list[bytes], int]:
        """(the index keys of every full KEY_TOKENS block of the parts joined, the number
        of token ids in them)."""
        out: list[bytes] = []
        steps, n = self._walk(namespace, parts)
        for step in steps:
            out += step.keys
        return out, n

    def chain_ids(self, namespace: str, parts: Iterable[bytes]) -> tuple[bytes, int]:
        """``chain_parts`` with the keys as their index names (``ID_BYTES`` each) joined."""
        steps, n = self._walk(namespace, parts)
        return b"".join([step.ids for step in steps]), n

    def _walk(self, namespace: str, parts: Iterable[bytes]) -> tuple[list["_Step"], int]:
        out: list[_Step] = []
        n = 0
        with self._lock:
            step = self._roots.get(namespace)
            if step is None:
                if len(self._roots) > 4096:
                    self._roots.clear()
                step = self._roots[namespace] = _Step((), chain_root(namespace), b"", None,
                                                      b"")
            for part in parts:
                n += len(part)
                got = step.next.get(part)
                if got is None:
                    got = self._add(step, part)
                else:
                    self.reused += len(got.keys)
                out.append(got)
                step = got
        return out, n // 4

    def _add(self, step: _Step, part: bytes) -> _Step:
        keys: list[bytes] = []
        digest, left = _steps(step.digest, step.left + part if step.left else part, keys)
        new = step.next[part] = _Step(tuple(keys), digest, left, step, part)
        self.hashed += len(keys)
        self._made.append(new)
        self.bytes += len(part) + 56 * len(keys)
        while self.bytes > self.max_bytes and len(self._made) > 1:
            old = self._made.popleft()
            self.bytes -= len(old.part) + 56 * len(old.keys)
            parent = old.parent
            if parent is not None and parent.next.get(old.part) is old:
                del parent.next[old.part]
            old.parent = None
        return new


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
