"""What each workflow's conversations asked and which tools they called: tool retrieval's
memory (``tool_retrieval.select_for`` reads ``entries`` and calls ``learn``).

``WorkflowMemory`` keeps it in one process. ``SharedWorkflowMemory`` keeps it in Redis, so
every gateway worker learns from all the traffic and a restart forgets nothing: one stream
per (tenant, workflow) (``Keys.tool_memory``), an entry per conversation learned (a digest
of its user turns ``q``, their unit vector as float32 bytes ``v``, the tools called ``c``),
trimmed to about ``size`` entries and expiring when the workflow goes quiet. The user turns
are kept only as a digest (``query_id``: the memory needs them to tell one conversation
from another, never to read them), so Redis holds no request text of the tenant's (the
vector, as the semantic cache's, is kept). Each process holds a ``WorkflowMemory`` as its
mirror and, before reading a workflow's memory, asks the stream only for the entries after
the last one it has seen (one small round trip when nothing is new). Redis out or slow:
the mirror answers alone and learns locally, and Redis is left alone for ``RETRY_AFTER_S``.
(Co-called counts come from the entries read: ``app.core.tool_select.co_called_counts``.)
"""
from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from typing import Any

import numpy as np
import orjson
import redis

from app.contract.keys import Keys

log = logging.getLogger(__name__)
MEMORY_SIZE = 512          # conversations remembered per (tenant, workflow)
# A workflow's stream expires this long after its last conversation was learned (the TTL
# is set again on every write): a workflow gone quiet for a month leaves nothing behind.
MEMORY_TTL_S = 30 * 86400
# The memory's own Redis client waits this long at most (a select runs per request; the
# gateway's other sync clients wait 1 s); a failure skips Redis for RETRY_AFTER_S.
REDIS_TIMEOUT_S = 0.1
RETRY_AFTER_S = 2.0
READ_COUNT = 1024          # stream entries per XREAD (a stream holds about MEMORY_SIZE)
_DOWN = (redis.RedisError, OSError)


class WorkflowMemory:
    """The memory in this process: most recent ``size`` conversations per (tenant,
    workflow). A conversation is remembered from its later turns (their earlier
    ``tool_calls``), keyed by its user turns, so the tools a kind of task needs are sent
    the next time it is asked; the same user turns learned again replace the older."""

    def __init__(self, size: int = MEMORY_SIZE) -> None:
        self.size, self.lock = size, threading.Lock()
        self.data: dict[tuple, OrderedDict] = {}

    def learn(self, key: tuple, query: str, vec, called: list[str]) -> None:
        if not called:
            return
        with self.lock:
            mem = self.data.setdefault(key, OrderedDict())
            mem[query] = (vec, tuple(called))
            mem.move_to_end(query)
            while len(mem) > self.size:
                mem.popitem(last=False)

    def entries(self, key: tuple, other_than: str | None = None) -> list:
        """The remembered (vector, called) pairs, oldest first; ``other_than``: not the
        conversation with those user turns (its own earlier turns)."""
        with self.lock:
            return [v for q, v in (self.data.get(key) or {}).items() if q != other_than]


def query_id(query: str) -> str:
    """What the shared memory keeps of a conversation's user turns: a digest."""
    return hashlib.blake2b(query.encode(), digest_size=16).hexdigest()


def _stream_id(raw: Any) -> tuple[int, int]:
    ms, _, seq = (raw.decode() if isinstance(raw, bytes) else str(raw)).partition("-")
    return int(ms), int(seq or 0)


def _decode(fields: dict) -> tuple[str, Any, tuple[str, ...]] | None:
    """(query, vector, called) of a stream entry; None for one this code cannot read."""
    try:
        q, v, c = fields[b"q"], fields[b"v"], fields[b"c"]
        return q.decode(), np.frombuffer(v, dtype=np.float32), tuple(orjson.loads(c))
    except (KeyError, ValueError, TypeError, AttributeError):
        return None


class SharedWorkflowMemory:
    """``WorkflowMemory``'s interface, shared by every gateway process through Redis (see
    the module doc). ``client``: a sync Redis client (``select`` runs in a worker thread),
    without decoded responses, whose timeouts bound what a request waits;
    ``memory_client`` builds one."""

    def __init__(self, client: redis.Redis, keys: Keys, size: int = MEMORY_SIZE,
                 ttl_s: int = MEMORY_TTL_S) -> None:
        self.redis, self.keys, self.size, self.ttl_s = client, keys, size, ttl_s
        self.mirror = WorkflowMemory(size)
        self._lock = threading.Lock()
        self._seen: dict[tuple, tuple[int, int]] = {}   # key -> last stream id applied
        self._down_until = 0.0
        self._failing = False

    def _name(self, key: tuple) -> str:
        return self.keys.tool_memory(*key)

    # ---- Redis out: skip it a while, say so once per burst ----------------------------
    def _available(self) -> bool:
        return time.monotonic() >= self._down_until

    def _failed(self, what: str, exc: Exception) -> None:
        self._down_until = time.monotonic() + RETRY_AFTER_S
        if not self._failing:
            self._failing = True
            log.debug("tool memory %s: Redis unreachable, this process's memory only "
                      "(retried every %.0f s): %s", what, RETRY_AFTER_S, exc)

    def _ok(self) -> None:
        if self._failing:
            self._failing = False
            log.debug("tool memory: Redis reachable again")

    # ---- the interface --------------------------------------------------------------
    def learn(self, key: tuple, query: str, vec, called: list[str]) -> None:
        """Into the mirror now (this process reads it even if Redis fails) and onto the
        workflow's stream, whose TTL starts again."""
        if not called:
            return
        query = query_id(query)
        self.mirror.learn(key, query, vec, called)
        if not self._available():
            return
        name = self._name(key)
        fields = {"q": query, "v": np.asarray(vec, dtype=np.float32).tobytes(),
                  "c": orjson.dumps(list(called))}
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.xadd(name, fields, maxlen=self.size, approximate=True)
            pipe.expire(name, self.ttl_s)
            pipe.execute()
            self._ok()
        except _DOWN as exc:
            self._failed("write", exc)

    def entries(self, key: tuple, other_than: str | None = None) -> list:
        """As ``WorkflowMemory.entries``, after the mirror has read what the stream gained
        since it last looked (every gateway process's conversations)."""
        self.sync(key)
        return self.mirror.entries(key, None if other_than is None else query_id(other_than))

    def sync(self, key: tuple) -> None:
        """Apply the workflow's stream entries newer than the last one applied, in stream
        order (a query learned again moves to the end, as in the mirror). Threads that
        read the same entries concurrently apply each once."""
        if not self._available():
            return
        with self._lock:
            last = self._seen.get(key, (0, 0))
        name, start = self._name(key), "%d-%d" % last
        try:
            read: list = []
            while True:
                got = self.redis.xread({name: start}, count=READ_COUNT)
                batch = got[0][1] if got else []
                read += batch
                if len(batch) < READ_COUNT:
                    break
                start = batch[-1][0]
            self._ok()
        except _DOWN as exc:
            self._failed("read", exc)
            return
        if read:
            self._apply(key, read)

    def _apply(self, key: tuple, read: list) -> None:
        with self._lock:
            last = self._seen.get(key, (0, 0))
            for raw_id, fields in read:
                sid = _stream_id(raw_id)
                if sid <= last:
                    continue   # another thread applied it meanwhile
                last = sid
                entry = _decode(fields)
                if entry is not None:
                    self.mirror.learn(key, entry[0], entry[1], list(entry[2]))
            self._seen[key] = last


def memory_client(url: str) -> redis.Redis:
    """A sync client for ``SharedWorkflowMemory``: short timeouts, no retries (a memory
    that does not answer at once is skipped, not waited for)."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry
    return redis.Redis.from_url(url, socket_timeout=REDIS_TIMEOUT_S,
                                socket_connect_timeout=REDIS_TIMEOUT_S,
                                retry=Retry(NoBackoff(), 0))
