"""S03 with replica_choice kv_events through real gateway processes: the replica whose KV
blocks (in the Redis index the engines' events keep) cover the prompt wins; two gateway
processes make the same choice; a stale index falls back to today's rendezvous; the
gateway's prompt ids are the engine's; events in vLLM's own wire format, with vLLM's own
per-process block hashes, give index keys the gateway reaches from the prompt (cache salt
and LoRA included), and tenants with different salts never reach each other's."""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import time

import httpx
import msgspec
import pytest
import redis as redis_lib
import zmq

from app.contract import kv_index
from app.contract.keys import Keys
from app.contract.tokenizers import chat_tokenizer
from app.core.rendezvous import ReplicaView, affinity_key, hrw_order
from app.gateway.kv_route import PromptTokens, request_chain, request_ids
from tests.conftest import REDIS_URL
from tests.engine.conftest import free_port
from tests.gateway.conftest import make_world, publish_and_wait, wait_for
from tests.servers import FRONTIER_KEY, Server
from workers.pools.kv_subscriber import KVSubscriber

MSGS = [{"role": "system", "content": "You sort invoices into ledgers. " * 12},
        {"role": "user", "content": "Invoice 4411 from Acme for 12 chairs, where to?"}]
# a last message longer than TAIL_CHARS: the whole prompt is matched, as the engine reuses it
LONG = MSGS[:1] + [{"role": "user", "content": "Invoice 4411 from Acme for 12 chairs. " * 16}]


@pytest.fixture(scope="module")
def tokens():
    return PromptTokens(chat_tokenizer("smollm2"))


def test_prompt_ids_are_the_engines(tokens):
    tok = tokens.tok
    bodies = [{"messages": MSGS},
              {"messages": MSGS + [{"role": "assistant", "content": "Ledger 7."},
                                   {"role": "user", "content": "And <b>4412</b>?\n\n  ok"}]},
              {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi "},
                                                         {"type": "text", "text": "there"}]}]}]
    for body in bodies * 2:           # the second round comes from the piece cache
        msgs = [{**m, "content": m["content"] if isinstance(m["content"], str) else
                 "".join(p["text"] for p in m["content"])} for m in body["messages"]]
        engine = tok.encode(tok.apply_chat_template(msgs, add_generation_prompt=True,
                                                    tokenize=False), add_special_tokens=False)
        assert tokens.prompt_ids(body) == engine
    assert tokens.hits > 0
    # plain conversations take the direct render and encode (checked against transformers
    # when the tokenizer loaded); a body with tools or tool calls takes apply_chat_template
    assert tokens.render is not None
    tools = [{"type": "function", "function": {"name": "route", "description": "Route it.",
                                               "parameters": {"type": "object"}}}]
    called = MSGS + [{"role": "assistant", "content": "",
                      "tool_calls": [{"id": "c1", "type": "function",
                                      "function": {"name": "route", "arguments": "{}"}}]}]
    for body in ({"messages": MSGS, "tools": tools}, {"messages": called}):
        text = tok.apply_chat_template([dict(m) for m in body["messages"]],
                                       add_generation_prompt=True, tokenize=False,
                                       **({"tools": tools} if "tools" in body else {}))
        assert tokens.prompt_ids(body) == tok.encode(text, add_special_tokens=False)


def test_a_template_that_renders_differently_directly_is_not_rendered_directly(tokens):
    from app.gateway import kv_route

    class Odd:                       # the real tokenizer, but its own render adds a line
        def __init__(self, tok):
            self.tok = tok

        def __getattr__(self, name):
            return getattr(self.tok, name)

        def apply_chat_template(self, *a, **kw):
            return self.tok.apply_chat_template(*a, **kw) + "\n"
    assert kv_route._direct_render(Odd(tokens.tok)) is None
    assert kv_route._direct_render(tokens.tok) is not None


def test_conversations_filled_into_a_role_skeleton_render_as_the_template_does(tokens):
    import random
    rng = random.Random(7)
    pieces = ["Hi", " spaced \n\n", "{{ x }}", "<|im_start|>user", "é 42", "<think>a</think>b"]
    for _ in range(200):
        msgs = [{"role": rng.choice(["system", "user", "assistant"]),
                 "content": "".join(rng.choices(pieces, k=rng.randint(1, 3)))}
                for _ in range(rng.randint(1, 6))]
        assert tokens.render_plain(msgs) == tokens.tok.apply_chat_template(
            msgs, add_generation_prompt=True, tokenize=False)
    assert any(s is not None for s in tokens.skeletons.values())
    # an empty content or a NUL in one is rendered, not filled
    for msgs in ([{"role": "user", "content": ""}], [{"role": "user", "content": "a\x00b"}]):
        assert tokens.render_plain(msgs) == tokens.tok.apply_chat_template(
            msgs, add_generation_prompt=True, tokenize=False)


def test_prompts_joined_from_a_shapes_pieces_tokenize_as_the_engine_does(tokens):
    """``plain_parts`` gives each piece from the shape's plan (no render, no search for
    special tokens) when no content holds a special token's first character, and renders
    otherwise: the ids are the engine's either way."""
    import random
    from array import array
    rng = random.Random(11)
    words = ["Hi", " spaced \n\n", "{{ x }}", "é 42", "ledger", "\n", "  ", "<|im_end|>",
             "<b>", "a<", "im_start|>"]
    tok = tokens.tok
    fast = 0
    for _ in range(300):
        msgs = [{"role": rng.choice(["system", "user", "assistant"]),
                 "content": "".join(rng.choices(words, k=rng.randint(1, 4)))}
                for _ in range(rng.randint(1, 5))]
        want = tok.encode(tok.apply_chat_template(msgs, add_generation_prompt=True,
                                                  tokenize=False), add_special_tokens=False)
        assert array("I", b"".join(tokens.plain_parts(msgs))).tolist() == want, msgs
        fast += not any("<" in m["content"] for m in msgs)
    assert fast > 50
    assert any(p is not None for p in tokens.plans.values())


def test_a_short_last_message_is_left_out_of_the_chain(tokens):
    """The index is matched on the prompt up to its last message when that message is at
    most TAIL_CHARS long (not tokenized: a new question's blocks are held nowhere); a
    longer one, or one the shape's plan does not take, is matched whole. The prompt's
    token count is then the known ids plus an estimate of the left-out ones."""
    import random
    from app.core.kv_keys import block_hash_chain, key_namespace
    from app.gateway.kv_route import TAIL_CHARS
    tok = tokens.tok
    start = tok.convert_tokens_to_ids("<|im_start|>")
    ns = key_namespace(None, "t")
    rng = random.Random(5)
    words = ["Invoice", " 4411", " from Acme", " for chairs", ",", " where", " to?", "\n"]
    left_out = whole = 0
    for _ in range(120):
        msgs = [{"role": "system", "content": "You sort invoices into ledgers. " * 12}]
        for turn in range(rng.randint(1, 3)):
            msgs.append({"role": "user", "content": "".join(
                rng.choices(words, k=rng.choice([3, 30, 120])))})
            msgs.append({"role": "assistant", "content": "Ledger 7."})
        msgs.pop()
        body = {"messages": msgs}
        ids = tokens.prompt_ids(body)
        chain, n = request_chain(tokens, body, None, "t")
        # what the route call sends: the same keys as their index names, joined
        assert request_ids(tokens, body, None, "t") == (
            b"".join(kv_index.block_id(h) for h in chain), n)
        if len(msgs[-1]["content"]) <= TAIL_CHARS:
            # ChatML: the pieces before the last message end at its <|im_start|>
            cut = [i for i, t in enumerate(ids) if t == start][-2] + 1
            assert chain == block_hash_chain(ns, ids[:cut])
            assert cut < n and abs(n - len(ids)) <= max(4, 0.5 * (len(ids) - cut))
            left_out += 1
        else:
            assert chain == block_hash_chain(ns, ids)[:(len(ids) - 1) // 16]
            assert n == len(ids)
            whole += 1
    assert left_out > 20 and whole > 20
    # a last message the plan does not take (a special token's first character) is
    # rendered and matched whole
    body = {"messages": MSGS[:1] + [{"role": "user", "content": "Is <b> bold?"}]}
    ids = tokens.prompt_ids(body)
    assert request_chain(tokens, body, None, "t") == (
        block_hash_chain(ns, ids)[:(len(ids) - 1) // 16], len(ids))


def test_the_route_memo_gives_what_the_chain_gives(tokens):
    """``request_ids`` keeps its result per (namespace, roles, contents before a short last
    message): a later body with the same earlier messages and another short question (a
    new object, as each request parses its own) gets the chain ``request_chain`` computes
    from scratch; other salts, roles, earlier contents, long or unsafe last messages, tools
    and content parts are not served from another's entry; the memo keeps its bound."""
    import json
    import random
    rng = random.Random(17)
    tokens = PromptTokens(tokens.tok)            # a memo of its own
    fresh = PromptTokens(tokens.tok)             # the chain from scratch, never memoized
    system = "You sort invoices into ledgers. " * 12
    questions = ["Invoice 4411 from Acme, where to?", "And 4412?", "x" * 511, "y" * 512,
                 "z" * 513, "Is <b> bold?", "Where does 9 go?\n\n", "é"]
    prefixes = [[{"role": "system", "content": system}],
                [{"role": "system", "content": system + "!"}],
                [{"role": "developer", "content": system}],
                [{"role": "system", "content": system}, {"role": "user", "content": "Hi"},
                 {"role": "assistant", "content": "Ledger 7."}],
                [{"role": "system", "content": "Sort <b>these</b>."}]]
    checked = 0
    for _ in range(160):
        msgs = rng.choice(prefixes) + [{"role": "user", "content": rng.choice(questions)}]
        body = json.loads(json.dumps({"messages": msgs}))
        if rng.random() < 0.1:
            body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
        salt = rng.choice(["t", "u", ""])
        chain, n = request_chain(fresh, body, None, salt)
        fresh.chains = type(fresh.chains)()      # no step kept between bodies either
        assert request_ids(tokens, body, None, salt) == (
            b"".join(kv_index.block_id(h) for h in chain), n), body
        checked += 1
    assert tokens.memo_hits > 60 and checked == 160
    # a body of content parts is matched as its joined text, never through the memo
    parts = {"messages": [{"role": "system", "content": [{"type": "text", "text": system}]},
                          {"role": "user", "content": "And 4412?"}]}
    hits = tokens.memo_hits
    assert request_ids(tokens, parts, None, "t") == request_ids(tokens, json.loads(
        json.dumps({"messages": [{"role": "system", "content": system},
                                 {"role": "user", "content": "And 4412?"}]})), None, "t")
    assert tokens.memo_hits == hits + 1          # the plain body's, not the parts'
    # the bound: the oldest entries go
    tokens.route_memo_max = 2 * len(system)
    for i in range(6):
        request_ids(tokens, {"messages": [{"role": "system", "content": f"{i} {system}"},
                                          {"role": "user", "content": "Hi"}]}, None, "t")
    assert tokens.route_memo_chars <= tokens.route_memo_max
    assert 1 <= len(tokens.route_memo) <= 2


def test_a_template_that_trims_contents_keeps_its_render(tokens):
    odd = PromptTokens(tokens.tok)
    odd.render = lambda msgs: "".join(f"<{m['role']}>{m['content'].strip()}|" for m in msgs)
    msgs = [{"role": "user", "content": "  padded  "}]
    assert odd.render_plain(msgs) == "<user>padded|"
    assert odd.skeletons[("user",)] is None


# -- vLLM's structs as vllm/distributed/kv_events.py declares them today (each event a map
# tagged by "type", vllm-project/vllm#42892) and before that (positional arrays, up to
# lora_name as in vLLM 0.11) -------------------------------------------------------------
class VEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list
    data_parallel_rank: int | None = None


class VKVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class VBlockStored(VKVCacheEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class OldEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list


class OldKVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False,
                      tag=True):
    pass


class OldBlockStored(OldKVCacheEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class VllmProcess:
    """What one vLLM process publishes for a prompt: its block hashes (hash_block_tokens
    with the default sha256 over a pickle, from NONE_HASH = 32 random bytes when
    PYTHONHASHSEED is unset; extra keys LoRA name on every block, cache salt on the first;
    the low 64 bits on the wire) in BlockStored runs as cache_full_blocks emits them."""

    def __init__(self, block_size: int = 16) -> None:
        self.none_hash, self.block_size = os.urandom(32), block_size

    def events(self, ids: list[int], cut: int, salt: str | None = None,
               lora: tuple[str, int] | None = None, old: bool = False) -> list:
        b, parent, hashes, extra = self.block_size, self.none_hash, [], []
        for start in range(0, len(ids) // b * b, b):
            keys = tuple(([lora[0]] if lora else []) + ([salt] if start == 0 and salt else []))
            parent = hashlib.sha256(pickle.dumps((parent, tuple(ids[start:start + b]),
                                                  keys or None))).digest()
            hashes.append(int.from_bytes(parent, "big") & (2**64 - 1))
            extra.append(keys or None)
        out = []
        for lo, hi in ((0, cut), (cut, len(hashes))):     # two scheduler steps
            fields = dict(block_hashes=hashes[lo:hi],
                          parent_block_hash=hashes[lo - 1] if lo else None,
                          token_ids=ids[lo * b:hi * b], block_size=b,
                          lora_id=lora[1] if lora else None, medium="GPU",
                          lora_name=lora[0] if lora else None)
            out.append(OldBlockStored(**fields) if old else VBlockStored(
                **fields, extra_keys=extra[lo:hi], group_idx=0,
                kv_cache_spec_kind="full_attention"))
        return out


@pytest.fixture()
def published(redis_namespace):
    """A ZMQ PUB socket per replica and the real subscriber indexing what they send."""
    r = redis_lib.Redis.from_url(REDIS_URL)
    keys = Keys(f"{redis_namespace}:kvwire{time.monotonic_ns()}")
    ctx, sub = zmq.Context(), KVSubscriber(r, keys)
    pubs: dict[int, zmq.Socket] = {}
    seqs: dict[int, int] = {}

    def send(replica: int, batch) -> None:
        if replica not in pubs:
            port = free_port()
            pubs[replica] = ctx.socket(zmq.PUB)
            pubs[replica].bind(f"tcp://127.0.0.1:{port}")
            sub.set_replicas([*sub.replicas.values(), {
                "id": replica, "endpoint": f"tcp://127.0.0.1:{port}", "topic": "kv"}])
            time.sleep(0.3)                                  # the SUB socket joins
        seq = seqs[replica] = seqs.get(replica, -1) + 1
        pubs[replica].send_multipart((b"kv", seq.to_bytes(8, "big"),
                                      msgspec.msgpack.encode(batch)))
        end = time.monotonic() + 5
        while sub.stats["batches"] < sum(s + 1 for s in seqs.values()) and \
                time.monotonic() < end:
            sub.poll(50)
    try:
        yield r, keys, send
    finally:
        for sock in pubs.values():
            sock.close(0)
        sub.close()
        ctx.term()
        for key in r.scan_iter(f"{keys.ns}:*"):
            r.delete(key)


def test_vllm_wire_events_give_the_keys_the_gateway_hashes(tokens, published):
    r, keys, send = published
    body = {"messages": LONG}
    ids = tokens.prompt_ids(body)           # the engine's ids (test above)
    full = (len(ids) - 1) // 16 * 16        # what the engine can reuse of this prompt
    first = VllmProcess().events(ids, 2, salt="tenant-a")
    send(1, VEventBatch(ts=time.time(), data_parallel_rank=0, events=first))
    send(2, VEventBatch(ts=time.time(), data_parallel_rank=0,
                        events=VllmProcess().events(ids, 3, salt="tenant-a",
                                                    lora=("sql-lora", 1))))
    send(3, OldEventBatch(ts=time.time(), events=VllmProcess().events(ids, 1, old=True)))

    def matched(adapter, salt):
        chain, _ = request_chain(tokens, body, adapter, salt)
        return kv_index.read_matched(r, keys, [1, 2, 3], chain, 16)
    assert matched(None, "tenant-a") == {1: full}
    assert matched("sql-lora", "tenant-a") == {2: full}
    # vLLM before extra_keys publishes no salt: its blocks index as unsalted
    assert matched(None, "") == {3: full}
    # the index holds its own keys, not the engine's hashes
    held = {bytes(m) for m in r.smembers(keys.replica_kv_blocks(1))}
    assert len(held) == len(ids) // 16
    assert not held & {h.to_bytes(8, "big") for e in first for h in e.block_hashes}


def test_tenants_with_different_salts_never_match_each_others_blocks(tokens, published):
    r, keys, send = published
    body = {"messages": LONG}
    ids = tokens.prompt_ids(body)
    full = (len(ids) - 1) // 16 * 16
    for replica, salt in ((1, "tenant-a"), (2, "tenant-b")):
        send(replica, VEventBatch(ts=time.time(), data_parallel_rank=0,
                                  events=VllmProcess().events(ids, 2, salt=salt)))
    for salt, home in (("tenant-a", 1), ("tenant-b", 2)):
        chain, _ = request_chain(tokens, body, None, salt)
        assert kv_index.read_matched(r, keys, [1, 2], chain, 16) == {home: full}
    chain, _ = request_chain(tokens, body, None, "tenant-c")
    assert kv_index.read_matched(r, keys, [1, 2], chain, 16) == {}
    chain, _ = request_chain(tokens, body, None, "")
    assert kv_index.read_matched(r, keys, [1, 2], chain, 16) == {}


def _send(url: str, key: str, session: str) -> str:
    r = httpx.post(url + "/chat/completions", timeout=30,
                   headers={"authorization": f"Bearer {key}", "x-sluice-session": session},
                   json={"model": "tier-1", "messages": MSGS})
    assert r.status_code == 200, r.text
    return r.headers["x-fake-replica"]


def test_kv_events_choice_is_shared_by_two_gateways_and_falls_back_when_stale(
        app, gateway, fake_replicas, frontier, redis_client, tokens, app_config,
        tmp_path_factory):
    from app.extensions import db
    w = make_world(app, gateway, [s.url for s in fake_replicas], frontier.url,
                   policy={"replica_choice": "kv_events"})
    w.pool.model = "smollm2"                   # the tokenizer the gateway loads
    db.session.commit()
    publish_and_wait(gateway)
    keys = Keys(app.config["REDIS_NAMESPACE"])
    url_to_name = {s.url: f"r{i}" for i, s in enumerate(fake_replicas)}
    rows = {url_to_name[r.url]: r for r in w.pool.replicas}
    views = [ReplicaView(id=r.id) for r in rows.values()]
    probe = _send(w.base_url, w.key, "probe")
    salt = httpx.get(fake_replicas[int(probe[1:])].url + "/stats").json()["last_body"][
        "cache_salt"]
    session = "kv-session-1"
    home = hrw_order(affinity_key(session, None, salt=salt), views)[0].id
    other = next(r for r in rows.values() if r.id != home)
    name_of = {r.id: n for n, r in rows.items()}

    # the blocks the engine would store for this prompt, on the replica rendezvous does
    # NOT pick, as the subscriber writes them
    chain, _ = request_chain(tokens, {"messages": MSGS}, None, salt)
    assert len(chain) > 4
    kv_index.apply_events(redis_client, keys, other.id, [("BlockStored", chain)], seq=0)
    kv_index.apply_events(redis_client, keys, home, [], seq=0)
    try:
        def fresh_then(base: str) -> bool:    # the subscriber's heartbeat, while we wait
            kv_index.heartbeat(redis_client, keys, [home, other.id])
            return _send(base, w.key, session) == name_of[other.id]
        # (the gateway loads its tokenizer on first use, falling back meanwhile)
        wait_for(lambda: fresh_then(w.base_url), timeout=60, what="kv_events choice")
        cfg = {"REDIS_URL": app_config["REDIS_URL"],
               "REDIS_NAMESPACE": app_config["REDIS_NAMESPACE"],
               "GATEWAY_SNAPSHOT_POLL_S": 0.1,
               "QDRANT_PATH": str(tmp_path_factory.mktemp("gw2-qdrant")),
               "GATEWAY_LEDGER_SPOOL_DIR": str(tmp_path_factory.mktemp("gw2-spool"))}
        second = Server("gateway", json.dumps(cfg),
                        env={"SLUICE_PROVIDER_KEY_FRONTIER": FRONTIER_KEY},
                        log_dir=tmp_path_factory.mktemp("gw2-logs"))
        try:
            base2 = second.url + "/v1"
            # a gateway that starts on a snapshot with a kv_events tenant loads the pool's
            # tokenizer before any request asks for it
            wait_for(lambda: httpx.get(second.url + "/healthz", timeout=5).json()
                     .get("kv_tokenizers", {}).get("smollm2") == "ready", timeout=60,
                     what="second gateway's tokenizer preloaded")
            # (the first gateway's requests went to `other`: the bound on requests sent
            # sends a few home before `other` is within it again)
            wait_for(lambda: fresh_then(base2), timeout=60,
                     what="second gateway's kv_events choice")
            # the index moves (the blocks now live on the home replica): both follow
            kv_index.forget(redis_client, keys, other.id, resync=True)
            kv_index.apply_events(redis_client, keys, other.id, [], seq=1)
            kv_index.apply_events(redis_client, keys, home, [("BlockStored", chain[:3])],
                                  seq=1)
            for base in (w.base_url, base2, w.base_url, base2):
                assert _send(base, w.key, session) == name_of[home]
            kv_index.apply_events(redis_client, keys, other.id, [("BlockStored", chain)],
                                  seq=2)
            assert {_send(b, w.key, session) for b in (w.base_url, base2)} == {
                name_of[other.id]}
            # stale: no subscriber heartbeat for longer than kv_index.STALE_S -> rendezvous
            for rid in (home, other.id):
                redis_client.hset(keys.replica_kv_state(rid), "seen", 1.0)
            for base in (w.base_url, base2):
                assert _send(base, w.key, session) == name_of[home]
        finally:
            second.stop()
    finally:
        for rid in (home, other.id):
            kv_index.forget(redis_client, keys, rid)


def test_a_streamed_request_counts_its_prefill_until_its_first_token(
        app, gateway, fake_replicas, frontier, redis_client):
    """S03 kv_events weighs the prompt tokens each replica has still to prefill: a
    streamed request's unmatched tokens count on its replica (``pending``, per gateway)
    from its acquire until its first token, and nothing of it is left once it is booked;
    a request that does not stream (its first token unseen) counts only in flight."""
    import threading
    from app.extensions import db
    w = make_world(app, gateway, [s.url for s in fake_replicas], frontier.url,
                   policy={"replica_choice": "kv_events"})
    w.pool.model = "smollm2"
    db.session.commit()
    publish_and_wait(gateway)
    keys = Keys(app.config["REDIS_NAMESPACE"])
    rids = [r.id for r in w.pool.replicas]
    for rid in rids:                                   # fresh, empty index entries
        kv_index.apply_events(redis_client, keys, rid, [], seq=0)

    def held(pending: bool) -> dict:
        """Per replica, the gateways' in-flight counts (or their pending-prefill fields,
        ``p:<gateway id>``) in its inflight hash."""
        out = {}
        for rid in rids:
            got = {k.decode(): int(v) for k, v in
                   redis_client.hgetall(keys.replica_inflight(rid)).items()
                   if k.startswith(b"p:") == pending}
            if got:
                out[rid] = got
        return out

    def call(stream: bool, out: list) -> None:
        kv_index.heartbeat(redis_client, keys, rids)
        body = {"model": "tier-1", "stream": stream,
                "messages": MSGS[:1] + [{"role": "user", "content": f"[[delay:1500]] {stream}"}]}
        r = httpx.post(w.base_url + "/chat/completions", json=body, timeout=30,
                       headers={"authorization": f"Bearer {w.key}"})
        out.append((r.status_code, r.text))
    try:
        _send(w.base_url, w.key, "warm")        # the gateway loads the pool's tokenizer
        wait_for(lambda: httpx.get(gateway.url + "/healthz", timeout=5).json()
                 .get("kv_tokenizers", {}).get("smollm2") == "ready", timeout=60,
                 what="tokenizer loaded")
        wait_for(lambda: not held(False), what="warm-up booked")
        prompt = len(PromptTokens(chat_tokenizer("smollm2")).prompt_ids(
            {"messages": MSGS[:1] + [{"role": "user", "content": "[[delay:1500]] True"}]}))
        for stream in (True, False):
            out: list = []
            t = threading.Thread(target=call, args=(stream, out))
            t.start()
            try:
                inflight = wait_for(lambda: held(False), timeout=10,
                                    what="request in flight")
                (rid, _), = inflight.items()
                pending = held(True)
                if stream:
                    # the whole prompt (nothing is indexed), as the gateway counts it
                    (prid, fields), = pending.items()
                    assert prid == rid and len(fields) == 1, pending
                    (tokens,) = fields.values()
                    assert abs(tokens - prompt) <= 8, (tokens, prompt)
                else:
                    assert pending == {}, pending
            finally:
                t.join(30)
            assert out and out[0][0] == 200, out
            wait_for(lambda: not held(False), what="request booked")
            assert held(True) == {}
        # the first token lowers the gateway's own figure; its next write on the replica
        # (another request's acquire there) carries it while the stream still runs
        out = []
        body = {"model": "tier-1", "stream": True, "messages": MSGS[:1] + [
            {"role": "user", "content": "[[chunk-delay:500]] one two three four five six "
                                        "seven eight nine ten"}]}
        t = threading.Thread(target=lambda: out.append(httpx.post(
            w.base_url + "/chat/completions", json=body, timeout=30,
            headers={"authorization": f"Bearer {w.key}"}).status_code))
        kv_index.heartbeat(redis_client, keys, rids)
        t.start()
        try:
            (rid, _), = wait_for(lambda: held(False), timeout=10,
                                 what="stream in flight").items()
            assert list(held(True)) == [rid]      # as acquired
            landed = None
            for n in range(40):                  # until a request lands on the same replica
                landed = _send(w.base_url, w.key, f"lower-{n}")
                if landed == next(f"r{i}" for i, f in enumerate(fake_replicas)
                                  if any(r.id == rid and r.url == f.url
                                         for r in w.pool.replicas)):
                    break
            assert t.is_alive(), "the stream ended before a request landed on its replica"
            assert held(False).get(rid), "the stream is in flight"
            assert held(True) == {}
        finally:
            t.join(30)
        assert out == [200]
    finally:
        for rid in rids:
            kv_index.forget(redis_client, keys, rid)
