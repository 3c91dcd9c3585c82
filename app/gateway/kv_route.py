"""S03 with ``replica_choice: kv_events``: the prompt's index keys matched against the
Redis KV-block index the engines' own events keep (``app.contract.kv_index``), then
``app.core.kv_routing.kv_choice``.

The index keys are chained hashes of token ids (``app.core.kv_keys.block_hash_chain``
under ``key_namespace(adapter, cache_salt)``, KEY_TOKENS per key) that the subscriber
rebuilds from the token ids in each engine's ``BlockStored`` events, so the gateway needs
the ids the engine sees: it renders the same chat template with the pool model's own
tokenizer. A plain conversation is rendered by filling its role sequence's skeleton (the
template rendered once with markers, checked against the template), not by running the
template per request; tokenizing is the costly part, so the rendered text is cut at the
tokenizer's special tokens (which the tokenizer never merges across) and each piece's ids
are kept in an LRU: a tenant's system prompt and tool block, and every earlier turn of a
conversation, are tokenized once per gateway process. The prompt goes on as those pieces'
ids, never joined: ``ChainCache`` keeps the step each piece took from the chain's state
before it, so a prompt costs a dict lookup per known piece and only its new pieces are
hashed (bench/kv_tokenize.py measures all three parts). A short last message (at most
TAIL_CHARS characters: the new question of most requests, whose blocks no engine holds) is
not tokenized at all: the chain stops before it. The tokenizer loads off the event loop
when a snapshot names a pool a ``kv_events`` tenant is served from (``preload``), else on
first use; until it is there, and whenever the index is stale or Redis is out, the choice
is today's rendezvous (telemetry ``replica_choice``: ``fallback``).
"""
from __future__ import annotations

import logging
import re
import threading
from array import array
from collections import OrderedDict
from typing import Any, Iterable

from app.contract import heap, kv_index
from app.contract.tokenizers import bpe_encoder, chat_tokenizer
from app.core.kv_keys import ID_BYTES, KEY_TOKENS, ChainCache, key_namespace
from app.core.kv_routing import TAIL_TOKENS

log = logging.getLogger(__name__)

BLOCK_TOKENS = KEY_TOKENS  # the index's key size, whatever the engines' block size
# A last message this short (the new question of most requests) is not tokenized for the
# choice: its blocks can be held only where the same conversation with the same last
# message was served, and tokenizing and hashing it was most of what the new-question
# requests paid for kv_events (bench/results/gateway_overhead.txt, 2026-12-06 evening).
TAIL_CHARS = 4 * TAIL_TOKENS
PIECE_CACHE = 4096         # tokenized pieces kept per tokenizer
# characters of earlier messages the route memo keeps per tokenizer (``request_ids``)
ROUTE_MEMO_CHARS = 8 << 20
SHAPES = 512               # role sequences whose rendered skeleton is kept per tokenizer

# A skeleton is the template rendered once with a marker for each message's content; a
# conversation of that role sequence is then the skeleton's text between the markers with
# its contents in their places (a string join, not a template render). The markers cannot
# occur in a tokenized prompt's text (NUL); contents that hold one are rendered instead.
_MARK = "\x00{}\x00"
_MARK_RE = re.compile("\x00(\\d+)\x00")
# What a skeleton must reproduce before it is used: a template that trims or tests the
# content (``| trim``, ``if '</think>' in content``) renders these differently and keeps
# the render for that shape.
_CHECKS = (" Lead and trail, {{ braces }} \n\n", "<think>t</think>answer", "x")


class PromptTokens:
    """A pool model's chat template + tokenizer, with the per-piece id cache."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        specials = sorted((t for t in tokenizer.get_added_vocab()), key=len, reverse=True)
        self.special_ids = {t: tokenizer.convert_tokens_to_ids(t) for t in specials}
        self.split = re.compile("(" + "|".join(map(re.escape, specials)) + ")") if specials \
            else None
        self.render = _direct_render(tokenizer)
        self._encode = _direct_encode(tokenizer)
        self.special_bytes = {t: array("I", [i]).tobytes() for t, i in self.special_ids.items()}
        self.pieces: OrderedDict[str, bytes] = OrderedDict()
        self.skeletons: dict[tuple, tuple[list[str], list[int]] | None] = {}
        self.plans: dict[tuple, list | None] = {}
        # per shape: (the plan's first piece that holds the last message's content, the
        # ids of the plan's pieces from there on less that content's)
        self.tails: dict[tuple, tuple[int, int]] = {}
        # a content holding none of these holds no special token, nor the start of one
        self.first_chars = "".join(sorted({t[0] for t in specials}))
        # what keeps a content off the plan: a marker's NUL or a special token's first
        # character (``in`` per character: a memchr-speed scan, faster than a regex class)
        self._unsafe = tuple("\x00" + self.first_chars)
        self.chains = ChainCache()     # index keys of recent prompts' leading blocks
        self.lock = threading.Lock()
        self.hits = self.misses = 0
        # (namespace, roles, contents before the last) of a plain conversation whose short
        # last message the chain leaves out -> (its index names joined, the prompt tokens
        # less that message's estimate, characters held): ``request_ids``
        self.route_memo: dict[tuple, tuple[bytes, int, int]] = {}
        self.route_memo_chars = 0
        self.route_memo_max = ROUTE_MEMO_CHARS
        self.memo_hits = 0

    def _piece(self, text: str) -> bytes:
        """``text``'s ids as uint32 bytes (the chain hashes bytes; joining a prompt's
        pieces costs less than building its id list and packing it)."""
        with self.lock:
            ids = self.pieces.get(text)
            if ids is not None:
                self.pieces.move_to_end(text)
                self.hits += 1
                return ids
        ids = array("I", self._encode(text)).tobytes()
        with self.lock:
            self.misses += 1
            self.pieces[text] = ids
            if len(self.pieces) > PIECE_CACHE:
                self.pieces.popitem(last=False)
        return ids

    def encode_bytes(self, text: str) -> bytes:
        """``encode(text)`` as uint32 bytes."""
        return b"".join(self.encode_parts(text))

    def encode_parts(self, text: str) -> list[bytes]:
        """``encode_bytes(text)`` as the ids of its pieces (cut at special tokens)."""
        if self.split is None:
            return [self._piece(text)]
        specials = self.special_bytes
        return self._parts(specials.get(part, part) for part in self.split.split(text) if part)

    def _parts(self, parts: Iterable[bytes | str]) -> list[bytes]:
        """The ids of a text given as its pieces, as uint32 bytes per piece: a special
        token's ids (bytes) as they are, each text piece from the cache (the same object
        each time, which ``ChainCache`` keys its steps by), else tokenized."""
        out: list[bytes] = []
        pieces, missed = self.pieces, []
        with self.lock:              # one acquire for the cached pieces of the whole text
            for part in parts:
                if part.__class__ is not str:
                    out.append(part)
                    continue
                ids = pieces.get(part)
                if ids is None:
                    missed.append((len(out), part))
                    out.append(b"")
                    continue
                pieces.move_to_end(part)
                self.hits += 1
                out.append(ids)
        for at, part in missed:      # tokenized outside the lock
            out[at] = self._piece(part)
        return out

    def encode(self, text: str) -> list[int]:
        return array("I", self.encode_bytes(text)).tolist()

    def _skeleton(self, roles: tuple) -> tuple[list[str], list[int]] | None:
        """The render of this role sequence as (literal texts, content slot between each
        two), or None when the template does not take contents verbatim."""
        def render(contents: list[str]) -> str:
            return self.render([{"role": r, "content": c} for r, c in zip(roles, contents)])
        try:
            parts = _MARK_RE.split(render([_MARK.format(i) for i in range(len(roles))]))
            skel = (parts[0::2], [int(i) for i in parts[1::2]])
            for check in _CHECKS:
                contents = [f"{check}{i}" for i in range(len(roles))]
                if _fill(skel, contents) != render(contents):
                    return None
            return skel
        except Exception:  # noqa: BLE001 - a template that refuses the shape: render it
            return None

    def _shape(self, roles: tuple) -> tuple[list[str], list[int]] | None:
        """The role sequence's skeleton (built and kept on first use), with its piece plan."""
        if roles in self.skeletons:
            return self.skeletons[roles]
        skel = self._skeleton(roles)
        if len(self.skeletons) >= SHAPES:
            first = next(iter(self.skeletons))
            self.skeletons.pop(first, None)
            self.plans.pop(first, None)
            self.tails.pop(first, None)
        plan = self.plans[roles] = self._plan(skel) if skel is not None else None
        if plan is not None:
            self.tails[roles] = self._tail(plan, len(roles) - 1)
        self.skeletons[roles] = skel
        return skel

    def _tail(self, plan: list, last: int) -> tuple[int, int]:
        """(index of the first piece of ``plan`` that holds content slot ``last``, the ids
        of the pieces from there on without that content: its literals tokenized alone)."""
        cut = next(i for i, item in enumerate(plan)
                   if item.__class__ is tuple and last in item)
        fixed = 0
        for item in plan[cut:]:
            fixed += len(item) // 4 if item.__class__ is bytes else \
                len(self._encode("".join(p for p in item if p.__class__ is str)))
        return cut, fixed

    def _plan(self, skel: tuple[list[str], list[int]]) -> list | None:
        """The skeleton cut where the tokenizer cuts its text, at the special tokens: per
        piece either ids (bytes: special tokens and the literal-only pieces between them,
        joined) or the literal texts and content slots whose join is one text to tokenize.
        For contents that hold no special token's first character the cuts all fall in
        the literals, so the render need not be built and searched per request. None
        when a literal ends in the beginning of a special token (one could then run on
        into a content)."""
        if self.split is None:
            return None
        literals, slots = skel
        if any(lit.endswith(t[:k]) for lit in literals for t in self.special_ids
               for k in range(1, len(t))):
            return None
        plan: list = []
        cur: list = []
        for i, lit in enumerate(literals):
            for j, part in enumerate(self.split.split(lit)):
                if j % 2:                          # a special token
                    if cur:
                        plan.append(tuple(cur))
                        cur = []
                    plan.append(self.special_bytes[part])
                elif part:
                    cur.append(part)
            if i < len(slots):
                cur.append(slots[i])
        if cur:
            plan.append(tuple(cur))
        # a piece of literals only (the "\n" between two turns, "assistant\n" at the end)
        # has the same ids for every conversation of the shape: tokenized here, once, and
        # joined with the special tokens around it, so a request looks up only the pieces
        # that hold a content (bench/results/gateway_overhead.txt, 2026-12-06)
        merged: list = []
        for item in plan:
            if item.__class__ is tuple and all(p.__class__ is str for p in item):
                item = self.encode_bytes("".join(item))
            if item.__class__ is bytes and merged and merged[-1].__class__ is bytes:
                merged[-1] += item
            else:
                merged.append(item)
        return merged

    def _plain_ok(self, contents: list[str]) -> bool:
        """Contents a skeleton takes verbatim: none empty, none with a marker's NUL."""
        return _takes_plan(contents, _NUL)

    def render_plain(self, messages: list[dict]) -> str:
        """``render(messages)`` (role and string content only), from the role sequence's
        skeleton when it has one."""
        contents = [m["content"] for m in messages]
        if self._plain_ok(contents):
            skel = self._shape(tuple(m.get("role") for m in messages))
            if skel is not None:
                return _fill(skel, contents)
        return self.render(messages)

    def plain_parts(self, messages: list[dict]) -> list[bytes]:
        """``encode_parts(render_plain(messages))``: from the shape's piece plan when the
        contents hold no special token's first character (each piece's text joined and
        looked up, the render neither built nor searched), else by that render."""
        return self._plain(messages, False)[0]

    def _plain(self, messages: list[dict], short_tail: bool) -> tuple[list[bytes], int]:
        """``plain_parts(messages)``, and 0; with ``short_tail``, a last message of at most
        TAIL_CHARS characters taken from a plan is left out: (the pieces before the one
        that holds it, an estimate of the ids left out: the fixed ones after the cut and a
        token per 4 characters of the message)."""
        contents = [m["content"] for m in messages]
        plan = None
        if _takes_plan(contents, self._unsafe):
            shape = tuple([m.get("role") for m in messages])
            plan = self.plans.get(shape) if self._shape(shape) is not None else None
        if plan is None:
            return self.encode_parts(self.render_plain(messages)), 0
        left_out = 0
        if short_tail and contents and len(contents[-1]) <= TAIL_CHARS:
            cut, fixed = self.tails[shape]
            plan = plan[:cut]
            left_out = fixed + _tail_estimate(len(contents[-1]))
        return self._parts([item if item.__class__ is bytes else
                            "".join([p if p.__class__ is str else contents[p] for p in item])
                            for item in plan]), left_out

    def prompt_ids(self, body: dict) -> list[int]:
        """The engine's prompt ids for a chat body (``Engine.encode_chat``'s plain path)."""
        return array("I", self.prompt_bytes(body)).tolist()

    def prompt_bytes(self, body: dict) -> bytes:
        """``prompt_ids(body)`` as uint32 bytes, as the chain hashes them."""
        return b"".join(self.prompt_parts(body))

    def prompt_parts(self, body: dict) -> list[bytes]:
        """``prompt_bytes(body)`` as its pieces' ids (a plain conversation's from its
        shape's plan: the static prefix and earlier turns are the same objects each time)."""
        return self._prompt(body, False)[0]

    def route_parts(self, body: dict) -> tuple[list[bytes], int]:
        """What the index is matched on: ``prompt_parts(body)`` less a plain conversation's
        last message when it is short (``_plain``), and an estimate of the ids left out
        (0 when none were)."""
        return self._prompt(body, True)

    def tail_probe(self, body: dict) -> tuple[tuple, int] | None:
        """((roles, contents before the last), the last content's length) of a body whose
        chain ``route_parts`` may cut before a short last message: a plain conversation
        (string contents, role and content only, no tools) whose last message is at most
        TAIL_CHARS characters and holds nothing that keeps it off the plan; else None.
        Whether the earlier contents take the plan is what ``route_parts`` says."""
        messages = body.get("messages")
        if not messages or body.get("tools") or self.render is None:
            return None
        roles, contents = [], []
        for m in messages:
            content = m.get("content")
            if content.__class__ is not str or len(m) > 2:
                return None
            roles.append(m.get("role"))
            contents.append(content)
        tail = contents.pop()
        if len(tail) > TAIL_CHARS or not _takes_plan((tail,), self._unsafe):
            return None
        return (tuple(roles), tuple(contents)), len(tail)

    def remember(self, key: tuple, ids: bytes, n: int) -> None:
        """Keep a ``request_ids`` result for ``key`` (``tail_probe``'s, with the namespace),
        the oldest going past ``route_memo_max`` characters."""
        chars = sum(map(len, key[2])) + len(ids)
        with self.lock:
            if key in self.route_memo:
                return
            self.route_memo[key] = (ids, n, chars)
            self.route_memo_chars += chars
            while self.route_memo_chars > self.route_memo_max and len(self.route_memo) > 1:
                self.route_memo_chars -= self.route_memo.pop(next(iter(self.route_memo)))[2]

    def _prompt(self, body: dict, short_tail: bool) -> tuple[list[bytes], int]:
        messages, plain = [], True
        for m in body.get("messages") or []:
            content = m.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            plain = plain and len(m) <= 2 and isinstance(content, str)
            # the plain path only reads role and content: a copy only where parts were joined
            messages.append(m if content is m.get("content") else {**m, "content": content})
        tools = body.get("tools")
        if plain and not tools and self.render is not None:
            return self._plain(messages, short_tail)
        kwargs = {"tools": tools} if tools else {}
        # the template gets copies: the request's own messages go upstream as they are
        text = self.tok.apply_chat_template([dict(m) for m in messages],
                                            add_generation_prompt=True, tokenize=False,
                                            **kwargs)
        return self.encode_parts(text), 0


_NUL = ("\x00",)


def _tail_estimate(chars: int) -> int:
    """The ids a left-out last message of ``chars`` characters stands for: one per 4
    characters, rounded up (``_plain``, and ``request_ids``' memo, which must agree)."""
    return (chars + 3) // 4


def _takes_plan(contents: list[str], unsafe: tuple[str, ...]) -> bool:
    """None of ``contents`` is empty or holds a character of ``unsafe``."""
    for c in contents:
        if not c:
            return False
        for ch in unsafe:
            if ch in c:
                return False
    return True


def _fill(skel: tuple[list[str], list[int]], contents: list[str]) -> str:
    literals, slots = skel
    out = [literals[0]]
    for slot, literal in zip(slots, literals[1:]):
        out.append(contents[slot])
        out.append(literal)
    return "".join(out)


# Conversations the direct render must render as apply_chat_template does before it is used
_PROBES = (
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <b>"}],
    [{"role": "user", "content": "Hello"}],
    [{"role": "system", "content": "S"}, {"role": "user", "content": "a"},
     {"role": "assistant", "content": "b"}, {"role": "user", "content": "c\n"}],
    [{"role": "user", "content": ""}, {"role": "assistant", "content": "x"},
     {"role": "user", "content": "{{ y }}"}])


def _direct_encode(tokenizer: Any):
    """``tokenizer.encode(text, add_special_tokens=False)`` by tiktoken over the same
    byte-level BPE (``bpe_encoder``: a fifth of the Rust tokenizer's cost on a long text),
    else through the Rust tokenizer directly (a third of the cost for a short text), when
    it gives the same ids on the probes; else the tokenizer's own ``encode``."""
    def slow(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return slow
    probes = [m["content"] for p in _PROBES for m in p] + [" lead", "a  b\n\n c", "é 42.5€"]
    bpe = bpe_encoder(backend)
    if bpe is not None and all(bpe(t) == slow(t) for t in probes):
        return bpe

    def fast(text: str) -> list[int]:
        return backend.encode(text, add_special_tokens=False).ids
    try:
        if all(fast(t) == slow(t) for t in probes):
            return fast
    except Exception as exc:  # noqa: BLE001 - the tokenizer's own encode then
        log.info("kv_events: no direct encode (%s)", exc)
    return slow


def _direct_render(tokenizer: Any):
    """``apply_chat_template(messages, add_generation_prompt=True, tokenize=False)`` for
    messages of only role and string content and no tools, at a fifth of its cost: the
    compiled template rendered with the tokenizer's special tokens, as transformers renders
    it (its template compiler, so the same globals). None when transformers' internals have
    moved or the two differ on the probes; the caller then takes the slow path."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
        compiled = _compile_jinja_template(tokenizer.chat_template)
        specials = dict(tokenizer.special_tokens_map)

        def render(messages: list[dict]) -> str:
            return compiled.render(messages=messages, tools=None, documents=None,
                                   add_generation_prompt=True, **specials)
        for probe in _PROBES:
            want = tokenizer.apply_chat_template([dict(m) for m in probe], tokenize=False,
                                                 add_generation_prompt=True)
            if render([dict(m) for m in probe]) != want:
                log.info("kv_events: the chat template renders differently directly; "
                         "using apply_chat_template")
                return None
        return render
    except Exception as exc:  # noqa: BLE001 - any failure: the slow, certain path
        log.info("kv_events: no direct chat-template render (%s)", exc)
        return None


_loaded: dict[str, PromptTokens | None] = {}
_loading: set[str] = set()
_lock = threading.Lock()
_load_lock = threading.Lock()


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
            # one load at a time: two threads importing transformers' lazy modules at
            # once can fail ("cannot import name 'AutoTokenizer'"), and a snapshot can
            # ask for several pools' tokenizers at once (``preload``)
            with _load_lock:
                value: PromptTokens | None = PromptTokens(chat_tokenizer(model))
            heap.settle(f"the {model} tokenizer")
        except Exception as exc:  # noqa: BLE001 - no tokenizer: rendezvous, said once
            log.warning("kv_events: no tokenizer for %s (%s); replica choice falls back",
                        model, exc)
            value = None
        with _lock:
            _loaded[model] = value
            _loading.discard(model)
    threading.Thread(target=load, name=f"tokenizer-{model}", daemon=True).start()
    return None


def tokenizer_states() -> dict[str, str]:
    """``{model: "ready" | "loading" | "failed"}`` of the tokenizers this process loaded or
    is loading (the gateway's /healthz)."""
    with _lock:
        out = {m: "ready" if t is not None else "failed" for m, t in _loaded.items()}
        out.update({m: "loading" for m in _loading})
    return out


def preload(snapshot) -> list[str]:
    """Start loading the tokenizer of every pool a ``kv_events`` tenant is served from (its
    allowed tiers' pools), so that a new snapshot's first kv requests need not fall back
    while it loads: loading on the first request cost the first 77 of 120 requests of the
    real-engine bench their choice, and each up to 114 ms of S03 while the loading thread
    held the GIL (bench/results/prefix_routing.txt). Returns the models asked for."""
    models: set[str] = set()
    for tenant in snapshot.tenants.values():
        if tenant["policy"].get("replica_choice") != "kv_events":
            continue
        for tier in snapshot.allowed_tiers(tenant):
            pool = snapshot.pools.get(str(tier.get("pool_id")))
            if pool is not None and pool.model and len(pool.replicas) > 1:
                models.add(pool.model)
    for model in sorted(models):
        prompt_tokens(model)
    return sorted(models)


def request_chain(tokens: PromptTokens, body: dict, adapter: str | None, salt: str
                  ) -> tuple[list[bytes], int]:
    """(index keys of the blocks the engine would look up for this request, prompt
    tokens). ``adapter``: the LoRA adapter that serves it, None for the base model."""
    parts, left_out = tokens.route_parts(body)
    chain, n = tokens.chains.chain_parts(key_namespace(adapter, salt), parts)
    n += left_out
    del chain[_looked_up(n):]
    return chain, n


def request_ids(tokens: PromptTokens, body: dict, adapter: str | None, salt: str
                ) -> tuple[bytes, int]:
    """``request_chain`` with its keys as their index names joined (``ID_BYTES`` each), as
    the route call sends them: one join per prompt part, not a slice per block.

    A conversation whose short last message the chain leaves out is matched on its earlier
    messages only, so its result is kept per (namespace, roles, earlier contents): the next
    request with the same system prompt and a new short question (most single-turn traffic)
    costs a dict lookup instead of the plan, the piece cache and the chain walk (48k of the
    113k instructions a request that kv_events added over today's S03, callgrind,
    bench/results/gateway_overhead.txt)."""
    namespace = key_namespace(adapter, salt)
    probe = tokens.tail_probe(body)
    if probe is not None:
        key = (namespace, *probe[0])
        got = tokens.route_memo.get(key)
        if got is not None:
            tokens.memo_hits += 1
            n = got[1] + _tail_estimate(probe[1])
            return got[0][:_looked_up(n) * ID_BYTES], n
    parts, left_out = tokens.route_parts(body)
    ids, n = tokens.chains.chain_ids(namespace, parts)
    if probe is not None and left_out:
        # route_parts cut the same short last message: the rest holds for any such one
        tokens.remember(key, ids, n + left_out - _tail_estimate(probe[1]))
    n += left_out
    return ids[:_looked_up(n) * ID_BYTES], n


def _looked_up(prompt_tokens: int) -> int:
    """The blocks the engine looks up for a prompt this long: (n - 1) // block tokens, as
    the last token is always computed."""
    return max(0, (prompt_tokens - 1) // BLOCK_TOKENS)


async def route_inputs(services, replica_ids: list, chain: bytes | list[bytes],
                       tally: dict | None = None, block_tokens: int = BLOCK_TOKENS
                       ) -> tuple[dict, dict | None, dict, dict] | None:
    """(loads, matched prompt tokens per replica or None when the index is stale or empty
    of fresh replicas, requests sent per replica, prompt tokens awaiting prefill per
    replica) from Redis in one round trip, which also
    adds ``tally`` (this process's choices not yet counted); None when Redis is out (the
    caller falls back, without loads, and keeps its tally)."""
    try:
        return await kv_index.read_route_inputs_async(services.redis, services.keys,
                                                      replica_ids, chain, block_tokens,
                                                      tally=tally)
    except Exception as exc:  # noqa: BLE001 - Redis out: the caller falls back
        log.debug("kv index unavailable: %s", exc)
        return None
