"""Moves ledger events from the request path to the Redis stream, off the hot path.

``submit`` never blocks or raises; a background task writes queued events in pipelined
batches. When Redis is down the events stay queued (bounded) and are retried, so a
Redis outage delays accounting instead of failing requests.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from datetime import date, datetime, timezone

import orjson

log = logging.getLogger(__name__)
REQUEST_TTL_S = 7 * 86400  # how long /v1/feedback can name a request
OWNER_DAYS = REQUEST_TTL_S // 86400 + 1


def request_owner_key(keys, day: date | None = None) -> str:
    """Hash of request_id -> tenant_id for one UTC day (feedback checks ownership)."""
    day = day or datetime.now(timezone.utc).date()
    return keys.k("req", day.strftime("%Y%m%d"))


class LedgerWriter:
    def __init__(self, redis, keys, metrics=None, *, max_backlog: int = 200_000,
                 batch: int = 256, linger_s: float = 0.02) -> None:
        self.redis = redis
        self.stream = keys.k("ledger", "stream")
        self.keys = keys
        self.metrics = metrics
        self.max_backlog = max_backlog
        self.batch = batch
        self.linger_s = linger_s  # wait this long after the first event to write a batch
        self.queue: deque[dict] = deque()
        self.dropped = 0
        self.written = 0
        self._wake = asyncio.Event()

    def submit(self, event: dict) -> None:
        if len(self.queue) >= self.max_backlog:
            self.queue.popleft()
            self.dropped += 1
            log.error("ledger backlog full, dropped the oldest event")
        self.queue.append(event)
        self._wake.set()

    async def flush(self) -> int:
        """Write everything queued; returns events written. Raises on Redis failure
        (the events stay queued). One stream entry carries up to ``batch`` events
        (field ``b``: a JSON array), so Redis work per request stays near zero."""
        done = 0
        while self.queue:
            n = min(len(self.queue), self.batch)
            events = [self.queue[i] for i in range(n)]
            owners = request_owner_key(self.keys)
            pipe = self.redis.pipeline(transaction=False)
            pipe.xadd(self.stream, {"b": orjson.dumps(events)})
            pipe.hset(owners, mapping={ev["request_id"]: ev["tenant_id"] for ev in events})
            pipe.expire(owners, REQUEST_TTL_S + 86400)
            await pipe.execute()
            for _ in range(n):
                self.queue.popleft()
            done += n
            self.written += n
        return done

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            if len(self.queue) < self.batch:
                await asyncio.sleep(self.linger_s)
            self._wake.clear()
            try:
                await self.flush()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - keep the events, retry shortly
                if self.metrics is not None:
                    self.metrics.ledger_errors.inc()
                log.warning("ledger stream write failed (%d queued): %s", len(self.queue), exc)
                await asyncio.sleep(0.5)
                self._wake.set()
            if self.metrics is not None:
                self.metrics.ledger_backlog.set(len(self.queue))
