"""Moves ledger events from the request path to the Redis stream, off the hot path.

``submit`` never blocks on the network and never raises. It first appends the event to
this process's spool file (one ``write`` to the page cache, which outlives a killed
process), then queues it; a background task writes queued events to the stream in
pipelined batches and empties the spool once everything in it is on the stream. So a
gateway killed at any moment loses no answered request's ledger event: the next gateway
process on the host finds the dead one's spool (its lock is free) and sends it on. A
replayed event that had reached the stream already is dropped by the drain, which is
idempotent on ``request_id``. When Redis is down the events stay queued and spooled,
and are retried, so an outage delays accounting instead of failing requests.

The in-memory queue is bounded (``max_backlog``); past it nothing is dropped: the
writer *spills*, i.e. new events go to the spool file only, from the offset where
spilling began, and are read back from the file in batches as the queue drains. The
spool is truncated only once the queue is empty and everything spilled was read back.
Only when the spool itself cannot be written (disk full) does a full queue drop its
oldest event (counted in ``dropped``).
"""
from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import uuid
from collections import deque
from pathlib import Path

import orjson

from app.contract.events import REQUEST_TTL_S, request_owner_key

log = logging.getLogger(__name__)
SPOOL_GLOB = "ledger-*.spool"


class Spool:
    """An append-only file of JSON lines, locked by its owner for its whole life."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / f"ledger-{os.getpid()}-{uuid.uuid4().hex[:8]}.spool"
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.dirty = False
        self.size = 0  # bytes written since the last clear

    def append(self, line: bytes) -> int:
        """Append one event line; returns the offset it starts at."""
        at = self.size
        data = line + b"\n"
        os.write(self.fd, data)
        self.size += len(data)
        self.dirty = True
        return at

    def read_from(self, offset: int, max_events: int,
                  chunk: int = 1 << 20) -> tuple[list[dict], int]:
        """Up to ``max_events`` whole event lines from ``offset``; returns (events, the
        offset after the last line read)."""
        events: list[dict] = []
        while len(events) < max_events and offset < self.size:
            data = os.pread(self.fd, min(chunk, self.size - offset), offset)
            end = data.rfind(b"\n")
            if end < 0:
                if len(data) < chunk:  # a torn last line (a write cut short): skip it
                    log.error("skipped a torn spool line of %d bytes", len(data))
                    offset += len(data)
                    break
                chunk *= 2
                continue
            for line in data[:end].split(b"\n"):
                offset += len(line) + 1
                try:
                    events.append(orjson.loads(line))
                except orjson.JSONDecodeError:
                    log.error("skipped an unreadable spool line")
                if len(events) >= max_events:
                    break
        return events, offset

    def clear(self) -> None:
        """Everything spooled is on the stream: start the file over."""
        if self.dirty:
            os.ftruncate(self.fd, 0)
            self.dirty = False
            self.size = 0

    def close(self, *, remove: bool) -> None:
        if remove:
            self.path.unlink(missing_ok=True)
        os.close(self.fd)

    def adopt_orphans(self) -> list[dict]:
        """Events in spools whose owner died (their lock is free); the files are
        removed once the events are in this spool."""
        events: list[dict] = []
        for path in sorted(self.dir.glob(SPOOL_GLOB)):
            if path == self.path:
                continue
            try:
                fd = os.open(path, os.O_RDWR)
            except FileNotFoundError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a live process owns it
                with os.fdopen(os.dup(fd), "rb") as f:
                    lines = f.read().split(b"\n")
                found = []
                for line in lines:
                    try:
                        found.append(orjson.loads(line))
                    except orjson.JSONDecodeError:
                        pass  # the torn last line of a process killed mid-write
                for ev in found:
                    self.append(orjson.dumps(ev))
                events.extend(found)
                path.unlink(missing_ok=True)
                if found:
                    log.warning("recovered %d ledger events from %s", len(found), path.name)
            finally:
                os.close(fd)
        return events


class LedgerWriter:
    def __init__(self, redis, keys, metrics=None, *, spool_dir: str | os.PathLike | None = None,
                 max_backlog: int = 200_000, batch: int = 256, linger_s: float = 0.02) -> None:
        self.redis = redis
        self.stream = keys.ledger_stream()
        self.keys = keys
        self.metrics = metrics
        self.max_backlog = max_backlog
        self.batch = batch
        self.linger_s = linger_s  # wait this long after the first event to write a batch
        self.queue: deque[dict] = deque()
        self.dropped = 0
        self.written = 0
        self.spilled = 0      # events that went to the spool file only (queue was full)
        self.spool_errors = 0
        self.spool = Spool(spool_dir) if spool_dir else None
        self.spill_at: int | None = None  # spool offset of the first event not queued
        self._wake = asyncio.Event()
        self.recovered = 0
        if self.spool is not None:
            # A dead gateway's events are now in this spool: read back like a spill.
            self.recovered = len(self.spool.adopt_orphans())
            if self.recovered:
                self.spill_at = 0
                self._wake.set()

    def submit(self, event: dict) -> None:
        at = None
        if self.spool is not None:
            try:
                at = self.spool.append(orjson.dumps(event))
            except OSError as exc:  # disk full: the event still goes out from memory
                self.spool_errors += 1
                log.error("ledger spool write failed: %s", exc)
        if at is not None and (self.spill_at is not None or len(self.queue) >= self.max_backlog):
            if self.spill_at is None:
                self.spill_at = at
                log.warning("ledger backlog at its cap (%d): spilling to the spool",
                            self.max_backlog)
            self.spilled += 1  # on disk only; read back when the queue drains
        else:
            if len(self.queue) >= self.max_backlog:
                self.queue.popleft()
                self.dropped += 1
                log.error("ledger backlog full and the spool unwritable: dropped the oldest "
                          "event")
            self.queue.append(event)
        self._wake.set()

    def _refill(self) -> None:
        """Move spilled events from the spool file back into the queue, up to the cap."""
        if self.spill_at is None or self.spool is None:
            return
        room = self.max_backlog - len(self.queue)
        if room <= 0:
            return
        events, self.spill_at = self.spool.read_from(self.spill_at, min(room, self.batch * 8))
        self.queue.extend(events)
        if self.spill_at >= self.spool.size:
            self.spill_at = None
            log.info("ledger spill read back")

    async def flush(self) -> int:
        """Write everything queued; returns events written. Raises on Redis failure
        (the events stay queued). One stream entry carries up to ``batch`` events
        (field ``b``: a JSON array), so Redis work per request stays near zero."""
        done = 0
        self._refill()
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
            if len(self.queue) < self.batch:
                self._refill()
        # No await since the queue emptied and the spill was read back: nothing was
        # spooled that is not on the stream.
        if self.spool is not None and self.spill_at is None:
            self.spool.clear()
        return done

    def close(self) -> None:
        """Give up the spool: removed when everything reached the stream, else left for
        the next gateway process to send on."""
        if self.spool is not None:
            self.spool.close(remove=not self.queue and self.spill_at is None)

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            if len(self.queue) < self.batch:
                await asyncio.sleep(self.linger_s)
            self._wake.clear()
            if not self.queue and self.spill_at is None:
                continue
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
            if self.spill_at is not None:
                self._wake.set()  # more spilled events to read back
