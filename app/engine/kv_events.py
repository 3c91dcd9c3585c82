"""KV-cache events of the reference engine, in vLLM's wire format (``--kv-events-config``).

vLLM (``vllm/distributed/kv_events.py``) publishes msgpack ``EventBatch`` structs (an array
``[ts, [events...], data_parallel_rank]``), each event a map tagged by ``type`` since
vllm-project/vllm#42892 (a positional array before it): ``BlockStored`` {block_hashes,
parent_block_hash, token_ids, block_size, lora_id, medium, lora_name, extra_keys (one per
block: LoRA name, multimodal ids, the cache salt on the first block), group_idx,
kv_cache_spec_kind}, ``BlockRemoved`` {block_hashes, medium, group_idx},
``AllBlocksCleared``; block hashes are the low 64 bits of the engine's digests as ints
(``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``, on by default). They go out as ZMQ multipart
``(topic, seq as 8 bytes big-endian, payload)`` on a PUB socket, and a ROUTER socket answers
replay requests: a client sends the first sequence number it missed (8 bytes big-endian)
and gets every buffered ``(seq, payload)`` from there, then an end marker whose seq is -1.
This module does the same from the engine's real prefix cache: blocks stored on insert,
removed on eviction, all cleared when the cache is cleared and when the engine starts (a
restarted engine holds nothing, and its seq restarts at 0). Like vLLM's, the hashes are
the engine's own (seeded per process), so nothing downstream may depend on them.
"""
from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections import deque
from itertools import count
from typing import Any

import msgspec

log = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
MEDIUM_GPU = "GPU"


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of the three events (the tag is the class name, under ``type``, as in vLLM)."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


def external_hash(digest: bytes) -> int:
    """vLLM's ``maybe_convert_block_hash``: the digest's low 64 bits as an int."""
    return int.from_bytes(digest, "big") & (2**64 - 1)


def parse_config(raw: str | None) -> dict | None:
    """``--kv-events-config`` JSON -> the settings, or None when events are off."""
    if not raw:
        return None
    cfg = json.loads(raw)
    if not cfg.get("enable_kv_cache_events") or cfg.get("publisher", "zmq") == "null":
        return None
    if cfg.get("publisher", "zmq") != "zmq":
        raise ValueError(f"unknown event publisher {cfg.get('publisher')!r}")
    return cfg


class ZmqEventPublisher:
    """PUB + ROUTER sockets served by one thread (zmq sockets are not thread-safe): the
    engine's worker thread only puts batches on a queue."""

    def __init__(self, endpoint: str, replay_endpoint: str | None = None, topic: str = "",
                 buffer_steps: int = 10_000, hwm: int = 100_000) -> None:
        import zmq
        self._zmq = zmq
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.bind(endpoint)
        self._replay = None
        if replay_endpoint:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.bind(replay_endpoint)
        self._topic = topic.encode()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._queue: queue.Queue[EventBatch | None] = queue.Queue()
        self._seq = count()
        self._encoder = msgspec.msgpack.Encoder()
        self.published = 0
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, cfg: dict) -> "ZmqEventPublisher":
        return cls(cfg.get("endpoint", "tcp://*:5557"), cfg.get("replay_endpoint"),
                   cfg.get("topic", ""), int(cfg.get("buffer_steps", 10_000)),
                   int(cfg.get("hwm", 100_000)))

    def publish(self, events: list) -> None:
        if events:
            self._queue.put(EventBatch(ts=time.time(), events=events, data_parallel_rank=0))

    def shutdown(self, timeout: float = 2.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout)
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(0)
        self._ctx.term()

    def _run(self) -> None:
        while True:
            if self._replay is not None:
                while self._replay.poll(0):
                    try:
                        self._serve_replay()
                    except Exception:  # noqa: BLE001 - a bad request must not stop events
                        log.exception("kv-events replay failed")
            try:
                batch = self._queue.get(timeout=0.05)
            except queue.Empty:
                continue
            if batch is None:
                return
            seq = next(self._seq)
            payload = self._encoder.encode(batch)
            self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
            self._buffer.append((seq, payload))
            self.published += 1

    def _serve_replay(self) -> None:
        frames = self._replay.recv_multipart()
        if len(frames) != 3:
            log.warning("kv-events: invalid replay request of %d frames", len(frames))
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):
            if seq >= first:
                self._replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", END_SEQ, b""))


class CacheEvents:
    """What ``PrefixCache`` calls: turns its block changes into vLLM events for one
    publisher. ``lora_name`` is set for blocks an adapter computed (the served model's own
    blocks carry None, as vLLM's do); ``extra_keys`` are vLLM's per block: the adapter's
    name on every block, the cache salt on a request's first block."""

    def __init__(self, publisher: ZmqEventPublisher, block_size: int,
                 served_model_name: str) -> None:
        self.publisher = publisher
        self.block_size = block_size
        self.served = served_model_name

    def stored(self, runs: list[tuple[bytes | None, list[bytes], list[int]]], model: str,
               cache_salt: str = "") -> list:
        """``runs``: (parent digest or None for a chain's first block, digests, token ids)."""
        lora = None if model == self.served else model
        out = []
        for parent, hashes, tokens in runs:
            extra: list[tuple | None] = []
            for i in range(len(hashes)):
                keys = ([lora] if lora else []) + (
                    [cache_salt] if parent is None and i == 0 and cache_salt else [])
                extra.append(tuple(keys) if keys else None)
            out.append(BlockStored(
                block_hashes=[external_hash(h) for h in hashes],
                parent_block_hash=None if parent is None else external_hash(parent),
                token_ids=tokens, block_size=self.block_size, lora_id=None,
                medium=MEDIUM_GPU, lora_name=lora, extra_keys=extra, group_idx=0,
                kv_cache_spec_kind="full_attention"))
        return out

    @staticmethod
    def removed(hashes: list[bytes]) -> list:
        return [BlockRemoved(block_hashes=[external_hash(h) for h in hashes],
                             medium=MEDIUM_GPU, group_idx=0)] if hashes else []

    def publish(self, events: list) -> None:
        self.publisher.publish(events)

    def cleared(self) -> None:
        self.publisher.publish([AllBlocksCleared()])
