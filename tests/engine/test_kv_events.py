"""KV-cache events of a real reference engine (``--kv-events-config``) in vLLM's wire format,
and the subscriber that keeps the Redis KV-block index from them: gaps replayed or
resynced, a restart or a dead replica clears its blocks, cache_salt keeps tenants apart."""
from __future__ import annotations

import json
import threading
import time

import msgspec
import pytest
import redis as redis_lib
import zmq

from app.contract import kv_index
from app.contract.keys import Keys
from app.core.kv_keys import BlockKeys, block_hash_chain, key_namespace
from tests.conftest import REDIS_URL
from tests.engine.conftest import EngineProcess, free_port
from tests.ports import free_port_run
from tests.replica_routing.test_block_keys import _held
from workers.pools.kv_subscriber import KVSubscriber


# -- vLLM's own definitions (vllm/distributed/kv_events.py since vllm-project/vllm#42892:
# the batch an array, each event a map tagged by ``type``) ---------------------------------
class VEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list
    data_parallel_rank: int | None = None


class VKVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(VKVCacheEvent):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(VKVCacheEvent):
    block_hashes: list[bytes | int]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(VKVCacheEvent):
    pass


class VKVEventBatch(VEventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


VLLM_DECODER = msgspec.msgpack.Decoder(type=VKVEventBatch)


def _keys(frames: list[list[bytes]]) -> list[tuple[str, list[bytes]]]:
    """What the subscriber makes of these frames: the index's own keys."""
    keys = BlockKeys()
    return [c for f in frames for c in keys.apply(kv_index.decode_batch(f[2]))]


class Events:
    """The test's own subscriber of one engine's PUB socket (every frame kept)."""

    def __init__(self, endpoint: str, topic: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self._joined(endpoint)
        self.frames: list[list[bytes]] = []

    def _joined(self, endpoint: str, timeout_s: float = 15.0) -> None:
        """Connect and return once the ZMTP handshake with the PUB is done: a PUB drops
        what it sends before the subscription reaches it (the slow joiner), so a fixed
        sleep lost the first events on a loaded box. The subscription goes out right after
        the handshake; the short sleep covers the PUB's I/O thread taking it in."""
        from zmq.utils.monitor import recv_monitor_message
        monitor = self.sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        try:
            self.sock.connect(endpoint)
            deadline = time.monotonic() + timeout_s
            while True:
                left = deadline - time.monotonic()
                assert left > 0 and monitor.poll(int(left * 1000)), f"no handshake with {endpoint}"
                if recv_monitor_message(monitor)["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    break
        finally:
            self.sock.disable_monitor()
            monitor.close(0)
        time.sleep(0.2)

    def drain(self, settle_s: float = 0.5) -> list[list[bytes]]:
        got = []
        while self.sock.poll(int(settle_s * 1000)):
            got.append(self.sock.recv_multipart())
        self.frames += got
        return got

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


def _config(pub: int, replay: int, buffer_steps: int = 10_000) -> str:
    return json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                       "endpoint": f"tcp://127.0.0.1:{pub}",
                       "replay_endpoint": f"tcp://127.0.0.1:{replay}", "topic": "kv@tiny-0",
                       "buffer_steps": buffer_steps})


def start_engine(tiny_model, log_dir, extra: list[str], name: str = "kv.log",
                 started=None) -> tuple[EngineProcess, int, int]:
    """A healthy engine publishing KV events on a free (pub, replay) pair of ports, chosen
    again when one was taken before the engine bound it (another process picked the same
    port in between: seen in CI as the replay socket's EADDRINUSE). ``started(pub,
    replay)`` runs as each try's process starts, before it is healthy."""
    for attempt in range(3):
        base = free_port_run(2)
        pub, replay = base, base + 1
        eng = EngineProcess(str(tiny_model), "tiny", log_dir / f"{attempt}-{name}",
                            extra=[*extra, "--kv-events-config", _config(pub, replay)])
        try:
            if started is not None:
                started(pub, replay)
            eng.wait_healthy()
            return eng, pub, replay
        except (RuntimeError, TimeoutError):
            taken = "Address already in use" in eng.log_text()
            eng.stop()
            if not taken or attempt == 2:
                raise
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def ports():
    return [0, 0]          # the engine fixture's (pub, replay), once it has bound them


@pytest.fixture(scope="module")
def engine(tiny_model, tmp_path_factory, ports):
    eng, ports[0], ports[1] = start_engine(
        tiny_model, tmp_path_factory.mktemp("log"),
        ["--max-prefix-tokens", "256", "--block-size", "16"])
    try:
        yield eng
    finally:
        eng.stop()


@pytest.fixture()
def redis_keys(redis_namespace):
    r = redis_lib.Redis.from_url(REDIS_URL)
    keys = Keys(f"{redis_namespace}:kvtest{time.monotonic_ns()}")
    yield r, keys
    for key in r.scan_iter(f"{keys.ns}:*"):
        r.delete(key)


def _prompt(i: int) -> str:
    return f"conversation {i}: " + " ".join(f"w{i}x{j}" for j in range(16))


def _own(i: int) -> list[dict]:
    return [{"role": "system", "content": _prompt(i)}, {"role": "user", "content": "ok?"}]


def test_events_are_vllms_wire_format_from_the_real_cache(engine, ports):
    ev = Events(f"tcp://127.0.0.1:{ports[0]}", "kv@tiny-0")
    try:
        assert engine.chat(_prompt(1), max_tokens=2).status_code == 200
        frames = ev.drain()
        assert frames, "no event after a request"
        # the engine says AllBlocksCleared as it starts; on a loaded box that frame can
        # still be on its way when the subscription is up: it may come first, alone
        first = [f for f in frames if b"BlockStored" in f[2]]
        assert first, f"no BlockStored after a request: {frames}"
        for topic, _, payload in frames[:frames.index(first[0])]:
            assert [e["type"] for e in msgspec.msgpack.decode(payload)[1]] == \
                ["AllBlocksCleared"]
        topic, seq, payload = first[0]
        assert topic == b"kv@tiny-0" and len(seq) == 8
        raw = msgspec.msgpack.decode(payload)    # the msgpack structure itself
        assert isinstance(raw[0], float) and isinstance(raw[1], list) and raw[2] == 0
        stored = raw[1][-1]
        assert stored["type"] == "BlockStored" and stored["parent_block_hash"] is None
        assert stored["block_size"] == 16 and stored["lora_id"] is None
        assert stored["medium"] == "GPU" and stored["lora_name"] is None
        assert stored["group_idx"] == 0 and stored["kv_cache_spec_kind"] == "full_attention"
        assert stored["extra_keys"] == [None] * len(stored["block_hashes"])
        assert len(stored["token_ids"]) == 16 * len(stored["block_hashes"])
        assert all(isinstance(h, int) and 0 <= h < 2**64 for h in stored["block_hashes"])
        batch = VLLM_DECODER.decode(payload)     # and vLLM's own decoder reads it
        blocks = batch.events[-1]
        assert isinstance(blocks, BlockStored)
        # the engine's hashes are its own (seeded per process, as vLLM's); the index keys
        # the subscriber makes of its events are the chain the gateway computes from the
        # prompt's token ids
        chain = [h[:8] for h in block_hash_chain(key_namespace(), blocks.token_ids, 16)]
        assert _keys([first[0]])[-1] == ("BlockStored", chain)

        # a budget of 256 tokens: more prompts evict the first one's blocks
        for i in range(2, 6):
            assert engine.chat(_prompt(i), max_tokens=2).status_code == 200
        later = [VLLM_DECODER.decode(f[2]) for f in ev.drain()]
        removed = [h for b in later for e in b.events if isinstance(e, BlockRemoved)
                   for h in e.block_hashes]
        assert set(blocks.block_hashes) & set(removed)
        seqs = [int.from_bytes(f[1], "big") for f in ev.frames]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    finally:
        ev.close()


def test_salted_tenants_share_no_block(engine, ports):
    ev = Events(f"tcp://127.0.0.1:{ports[0]}", "kv@tiny-0")
    try:
        for salt in ("tenant-a", "tenant-b"):
            assert engine.chat(_prompt(7), max_tokens=2, cache_salt=salt).status_code == 200
        stored = [e for f in ev.drain() for e in VLLM_DECODER.decode(f[2]).events
                  if isinstance(e, BlockStored) and e.parent_block_hash is None]
        a, b = stored[-2], stored[-1]
        assert a.token_ids == b.token_ids                     # the same prompt...
        assert not set(a.block_hashes) & set(b.block_hashes)  # ...in different blocks
        assert a.extra_keys[0] == ("tenant-a",) and a.extra_keys[1:] == [None] * (
            len(a.block_hashes) - 1)                          # the salt, as vLLM puts it
        # what the subscriber makes of them: each tenant's own keys, none shared
        runs = [e for f in ev.frames for e in kv_index.decode_batch(f[2])
                if e.kind == "BlockStored" and e.parent_block_hash is None]
        (_, keys_a), = BlockKeys().apply([runs[-2]])
        (_, keys_b), = BlockKeys().apply([runs[-1]])
        keys_a, keys_b = set(keys_a), set(keys_b)
        assert keys_a == {h[:8] for h in block_hash_chain(key_namespace(None, "tenant-a"),
                                                           a.token_ids, 16)}
        assert keys_a and keys_b and not keys_a & keys_b
    finally:
        ev.close()


class DroppingProxy:
    """A forwarder between the engine's PUB and the subscriber that loses the batches
    whose seq is in ``drop`` (a network fault the subscriber must notice)."""

    def __init__(self, upstream: str, drop: set[int]) -> None:
        self.ctx = zmq.Context()
        self.port = free_port()
        self.drop, self.stop = drop, threading.Event()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(upstream)
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.bind(f"tcp://127.0.0.1:{self.port}")
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            if self.sub.poll(50):
                frames = self.sub.recv_multipart()
                if int.from_bytes(frames[1], "big") not in self.drop:
                    self.pub.send_multipart(frames)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sub.close(0)
        self.pub.close(0)
        self.ctx.term()


def _engine_blocks(engine_events: list[list[bytes]]) -> set[bytes]:
    return _held(_keys(engine_events))


def _pump(sub: KVSubscriber, seconds: float = 1.0) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sub.poll(50)


@pytest.mark.parametrize("replayable", [True, False], ids=["replayed", "resynced"])
def test_a_gap_is_replayed_or_resynced(engine, ports, redis_keys, replayable):
    r, keys = redis_keys
    pub, replay = ports
    truth = Events(f"tcp://127.0.0.1:{pub}", "kv@tiny-0")
    time.sleep(0.3)
    # where the next batch's seq starts: one request, seen by the test's own subscriber
    assert engine.chat(_prompt(20), max_tokens=2).status_code == 200
    first = int.from_bytes(truth.drain()[-1][1], "big")
    proxy = DroppingProxy(f"tcp://127.0.0.1:{pub}", drop={first + 2, first + 3})
    sub = KVSubscriber(r, keys)
    try:
        sub.set_replicas([{"id": 1, "endpoint": f"tcp://127.0.0.1:{proxy.port}",
                           "replay": f"tcp://127.0.0.1:{replay}" if replayable else "",
                           "topic": "kv@tiny-0"}])
        time.sleep(0.5)
        for i in range(21, 26):                  # seq first+1 .. first+5; two are lost
            # each conversation's own system prompt: its first block is new, so the
            # subscriber that joined after the chat template's default block was stored
            # still places every block (BlockKeys.orphans)
            assert engine.chat(_own(i), max_tokens=2).status_code == 200
            _pump(sub, 0.3)
        _pump(sub)
        truth.drain()
        assert sub.stats["gaps"] == 1 and sub.orphans == 0
        index = {bytes(m) for m in r.smembers(keys.replica_kv_blocks(1))}
        if replayable:
            assert sub.stats["replayed"] == 2 and sub.stats["resyncs"] == 0
            # the index holds what the engine's whole stream says from first+1 on
            since = [f for f in truth.frames if int.from_bytes(f[1], "big") > first]
            assert index == _engine_blocks(since) and index
        else:
            assert sub.stats["resyncs"] == 1
            assert kv_index.freshness(r, keys, [1])[1]["resyncs"] == 1
            # rebuilt from the batches after the gap only: no block from before it
            after = [f for f in truth.frames if int.from_bytes(f[1], "big") > first + 3]
            assert index == _engine_blocks(after)
    finally:
        sub.close()
        proxy.close()
        truth.close()


def test_restart_and_death_clear_the_replicas_blocks(tiny_model, tmp_path_factory,
                                                     redis_keys):
    r, keys = redis_keys
    log = tmp_path_factory.mktemp("log")
    sub = KVSubscriber(r, keys)
    rep: dict = {}

    def subscribe(pub: int, replay: int) -> None:     # from the engine's start, as before
        rep.update({"id": 7, "endpoint": f"tcp://127.0.0.1:{pub}",
                    "replay": f"tcp://127.0.0.1:{replay}", "topic": "kv@tiny-0"})
        sub.set_replicas([rep])
    eng = None
    try:
        eng, pub, replay = start_engine(tiny_model, log, ["--max-prefix-tokens", "4096"],
                                        name="a.log", started=subscribe)
        cfg = _config(pub, replay)
        assert eng.chat(_prompt(30), max_tokens=2).status_code == 200
        _pump(sub)
        assert r.scard(keys.replica_kv_blocks(7)) > 0
        ev_blocks = {bytes(m) for m in r.smembers(keys.replica_kv_blocks(7))}
        eng.stop()
        # same ports, new process: its cache is empty and its seq starts again at 0
        eng = EngineProcess(str(tiny_model), "tiny", log / "b.log",
                            extra=["--max-prefix-tokens", "4096", "--kv-events-config", cfg])
        eng.wait_healthy()
        _pump(sub)
        assert eng.chat(_prompt(31), max_tokens=2).status_code == 200
        _pump(sub)
        now = {bytes(m) for m in r.smembers(keys.replica_kv_blocks(7))}
        # the old process's blocks are gone (a 4096-token budget evicts nothing); only the
        # chat template's leading block, which the new prompt shares, is held again
        assert now and len(ev_blocks - now) >= len(ev_blocks) - 1
        assert sub.stats["restarts"] == 1
        # the replica dies: the supervisor's list no longer has it, its blocks go at once
        sub.set_replicas([])
        assert not r.exists(keys.replica_kv_blocks(7))
        assert kv_index.read_matched(r, keys, [7], [b"x" * 32], 16) is None
    finally:
        sub.close()
        if eng is not None:
            eng.stop()


def test_a_subscriber_with_no_replicas_waits_instead_of_spinning(redis_keys):
    """A node none of whose replicas publish events (run.sh's pools) still runs the
    subscriber; zmq's poll returns at once with no socket, and the loop spun a whole core
    (seen by hand: 100% CPU in the worker, engines starved). It must wait its poll
    timeout: a handful of polls in half a second, not millions."""
    r, keys = redis_keys
    sub = KVSubscriber(r, keys)
    polls = []
    real = sub.poll

    def counted(timeout_ms: int = 100) -> int:
        polls.append(timeout_ms)
        return real(timeout_ms)
    sub.poll = counted
    stop = threading.Event()
    runner = threading.Thread(target=sub.run, args=(stop, lambda: [], 5.0))
    runner.start()
    time.sleep(0.5)
    stop.set()
    runner.join(5)
    sub.close()
    assert not runner.is_alive()
    assert 1 <= len(polls) <= 10, len(polls)
