"""KV-event subscriber: the replicas' ZMQ event streams into the Redis KV-block index.

One per node (or per pool): a SUB socket per replica (``{"id", "endpoint", "replay",
"topic"}``, from ``vllm_cmd.kv_event_endpoints``), each batch applied to
``app.contract.kv_index`` in order. The engine's block hashes are turned into the index's
own keys by a ``app.core.kv_keys.BlockKeys`` per replica (rebuilt from the token ids,
LoRA name and cache salt the events carry), so the gateway can compute them from a prompt
whatever hash and seed the engine uses. Sequence numbers are checked per replica:

- a gap (seq > last + 1) asks the replica's replay socket for the missed batches (vLLM's
  ROUTER protocol: send the first missed seq, receive ``(seq, payload)`` up to an end
  marker of seq -1); if the replay does not cover the gap, the replica's index is dropped
  and rebuilt from its next events (counted as a resync; the hash translations are kept,
  as the engine process is the same);
- a seq that goes back (the engine restarted: its cache is empty, its seq restarts at 0,
  its block hashes are new) drops the replica's index and translations;
- ``set_replicas`` without a replica (it died or was stopped) drops its blocks at once.

``run`` heartbeats every replica's index entries once a second; when the subscriber
stops, the entries expire (``kv_index.TTL_S``) and gateways fall back to rendezvous.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Mapping, Sequence

from app.contract import kv_index
from app.contract.keys import Keys
from app.core.kv_keys import BlockKeys

log = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class KVSubscriber:
    def __init__(self, redis, keys: Keys, *, replay_timeout_s: float = 1.0) -> None:
        import zmq
        self._zmq = zmq
        self.redis, self.keys = redis, keys
        self.ctx = zmq.Context()
        self.replay_timeout_ms = int(replay_timeout_s * 1000)
        self.socks: dict[Any, Any] = {}          # replica id -> SUB socket
        self.replicas: dict[Any, Mapping] = {}
        self.last_seq: dict[Any, int] = {}
        self.block_keys: dict[Any, BlockKeys] = {}
        self.poller = zmq.Poller()
        self.stats = {"batches": 0, "gaps": 0, "replayed": 0, "resyncs": 0, "restarts": 0}

    # -- the replica set ---------------------------------------------------------------
    def set_replicas(self, replicas: Sequence[Mapping]) -> None:
        """Subscribe to new replicas, drop the index of those no longer listed."""
        zmq = self._zmq
        want = {r["id"]: r for r in replicas if r.get("endpoint")}
        for rid in list(self.socks):
            if rid not in want or want[rid]["endpoint"] != self.replicas[rid]["endpoint"]:
                self._drop(rid)
        for rid, rep in want.items():
            if rid in self.socks:
                continue
            sock = self.ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SUBSCRIBE, str(rep.get("topic") or "").encode())
            sock.connect(rep["endpoint"])
            self.socks[rid], self.replicas[rid] = sock, dict(rep)
            self.block_keys[rid] = BlockKeys()
            self.poller.register(sock, zmq.POLLIN)
            # the replica's index starts empty: what it holds now arrives as stored events
            kv_index.forget(self.redis, self.keys, rid)

    def _drop(self, rid: Any) -> None:
        sock = self.socks.pop(rid)
        self.poller.unregister(sock)
        sock.close(0)
        self.replicas.pop(rid, None)
        self.last_seq.pop(rid, None)
        self.block_keys.pop(rid, None)
        kv_index.forget(self.redis, self.keys, rid)

    @property
    def orphans(self) -> int:
        """Stored blocks not placed because their parent came before this subscriber."""
        return sum(k.orphans for k in self.block_keys.values())

    def _resync(self, rid: Any) -> None:
        self.stats["resyncs"] += 1
        kv_index.forget(self.redis, self.keys, rid, resync=True)
        self.block_keys.setdefault(rid, BlockKeys()).forget_held()

    # -- events ------------------------------------------------------------------------
    def poll(self, timeout_ms: int = 100) -> int:
        """Apply whatever arrived within ``timeout_ms``; returns batches applied."""
        if not self.socks:
            # zmq's poll returns at once when nothing is registered: without this wait,
            # ``run`` spun a core on a node none of whose replicas publish KV events
            # (run.sh's embedded pools: seen at 100% CPU, agent requests 20-50 s)
            time.sleep(timeout_ms / 1000)
            return 0
        done = 0
        by_sock = {s: rid for rid, s in self.socks.items()}
        for sock, _ in self.poller.poll(timeout_ms):
            rid = by_sock.get(sock)
            if rid is None:
                continue
            while True:
                try:
                    frames = sock.recv_multipart(self._zmq.NOBLOCK)
                except self._zmq.Again:
                    break
                done += self._on_message(rid, frames)
        return done

    def _on_message(self, rid: Any, frames: list[bytes]) -> int:
        if len(frames) < 2:
            return 0
        seq, payload = int.from_bytes(frames[-2], "big"), frames[-1]
        last = self.last_seq.get(rid)
        applied = 0
        if last is not None and seq <= last:
            # seq went back: the engine restarted (a new publisher counts from 0)
            self.stats["restarts"] += 1
            kv_index.forget(self.redis, self.keys, rid, resync=True)
            self.block_keys[rid] = BlockKeys()
        elif last is not None and seq > last + 1:
            self.stats["gaps"] += 1
            applied += self._replay(rid, last + 1, seq)
        self._apply(rid, seq, payload)
        return applied + 1

    def _apply(self, rid: Any, seq: int, payload: bytes) -> None:
        block_keys = self.block_keys.setdefault(rid, BlockKeys())
        orphans = block_keys.orphans
        try:
            changes = block_keys.apply(kv_index.decode_batch(payload))
        except Exception as exc:  # noqa: BLE001 - one bad batch: resync, do not stop
            log.warning("replica %s: undecodable KV event batch %s: %s", rid, seq, exc)
            self._resync(rid)
            changes = []
        kv_index.apply_events(self.redis, self.keys, rid, changes, seq,
                              orphans=block_keys.orphans - orphans)
        self.last_seq[rid] = seq
        self.stats["batches"] += 1

    def _replay(self, rid: Any, first: int, upto: int) -> int:
        """Fetch batches ``first .. upto-1``; on any shortfall drop the replica's index
        (a resync: it rebuilds from the next events). Returns batches applied."""
        zmq = self._zmq
        endpoint = self.replicas[rid].get("replay")
        got: dict[int, bytes] = {}
        if endpoint:
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            try:
                sock.connect(endpoint)
                sock.send_multipart((b"", first.to_bytes(8, "big")))
                deadline = time.monotonic() + self.replay_timeout_ms / 1000
                while time.monotonic() < deadline:
                    if not sock.poll(max(1, int((deadline - time.monotonic()) * 1000))):
                        break
                    frames = sock.recv_multipart()
                    if frames[-2] == END_SEQ:
                        break
                    s = int.from_bytes(frames[-2], "big")
                    if first <= s < upto:
                        got[s] = frames[-1]
            finally:
                sock.close(0)
        if len(got) != upto - first:
            log.warning("replica %s: replay of %d..%d returned %d batches; resync", rid,
                        first, upto - 1, len(got))
            self._resync(rid)
            return 0
        for s in range(first, upto):
            self._apply(rid, s, got[s])
        self.stats["replayed"] += len(got)
        return len(got)

    # -- lifecycle ---------------------------------------------------------------------
    def run(self, stop: threading.Event, replicas_fn=None, refresh_s: float = 5.0) -> None:
        """Poll until ``stop``; heartbeat once a second; every ``refresh_s`` re-read the
        replica list from ``replicas_fn()`` (healthy replicas only: a dead one's blocks go)."""
        beat = refresh = 0.0
        while not stop.is_set():
            now = time.monotonic()
            if replicas_fn is not None and now - refresh >= refresh_s:
                self.set_replicas(replicas_fn())
                refresh = now
            self.poll(100)
            if now - beat >= 1.0:
                kv_index.heartbeat(self.redis, self.keys, list(self.socks))
                beat = now

    def close(self) -> None:
        for rid in list(self.socks):
            sock = self.socks.pop(rid)
            self.poller.unregister(sock)
            sock.close(0)
        self.ctx.term()


# -- supervision: one subscriber per node, in whichever worker process holds the lease ----
LEASE_S = 15
_state: dict[str, Any] = {"thread": None, "want": [], "token": None}
_state_lock = threading.Lock()


def ensure_running(redis, keys: Keys, node: str, replicas: Sequence[Mapping]) -> str:
    """Called by the ``pools.kv_index`` beat (every few seconds, in the node's worker):
    hands the subscriber the node's current replicas (so a dead replica's blocks go at
    the next tick) and starts it when no process of the node holds the lease (the first
    tick, or the process that held it died). Returns "running", "started" or "elsewhere"."""
    with _state_lock:
        _state["want"] = [dict(r) for r in replicas]
        thread = _state["thread"]
        if thread is not None and thread.is_alive():
            return "running"
        token = f"{os.getpid()}:{time.time_ns()}"
        if not redis.set(keys.kv_subscriber_lease(node), token, nx=True, ex=LEASE_S):
            return "elsewhere"
        _state["token"] = token
        thread = threading.Thread(target=_serve, args=(redis, keys, node, token),
                                  name=f"kv-subscriber-{node}", daemon=True)
        _state["thread"] = thread
        thread.start()
        return "started"


def _serve(redis, keys: Keys, node: str, token: str) -> None:
    stop = threading.Event()
    sub = KVSubscriber(redis, keys)
    lease = keys.kv_subscriber_lease(node)

    def replicas() -> list:
        # renew the lease with the list; another holder (ours expired) means stop
        if redis.get(lease) not in (token, token.encode()):
            stop.set()
            return []
        redis.expire(lease, LEASE_S)
        return _state["want"]
    try:
        sub.run(stop, replicas, refresh_s=2.0)
    except Exception:  # noqa: BLE001 - the next beat tick starts a new one
        log.exception("kv-event subscriber of node %s stopped", node)
    finally:
        sub.close()
        if redis.get(lease) in (token, token.encode()):
            redis.delete(lease)
