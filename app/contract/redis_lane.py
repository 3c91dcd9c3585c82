"""One pipelined asyncio connection for the gateway's per-request Redis scripts.

Every proxied request sends Redis five script calls (the budget's reserve and settle, S03's
loads or route read, the in-flight acquire and release). Through redis-py's asyncio client
each cost the gateway 84 us of CPU at 32 concurrent callers and 138 us at one; through a
lane 16 and 73 us (bench/results/gateway_overhead.txt, 2026-12-07 night). redis-py's cost is
a connection checked out of the pool and back, a retry wrapper, the observability hooks,
and a timer per read (a ``TimerHandle`` pushed into and left in the event loop's heap).

A ``Lane`` is one connection that carries every caller's commands back to back. A call
writes its packed command to the transport and waits on a future queued behind the
others; Redis answers a connection's commands in the order they came, so each reply hiredis
parses completes the oldest future. No checkout, no lock, no timer per call: one watchdog a
lane fails every waiting call and drops the connection when ``timeout_s`` passed with calls
waiting and no reply (a Redis that stopped answering), and the next call connects again. A
caller cancelled while it waits leaves its future queued; its reply is read and dropped, so
the order holds.

Errors are redis-py's (``ConnectionError``, ``TimeoutError``, ``NoScriptError`` and the
other ``ResponseError`` kinds, by redis-py's own parser), so callers catch what they
caught before. Replies are RESP2 as hiredis gives them, undecoded: what redis-py returns for
``EVALSHA`` on a client without ``decode_responses``.

The lane serves a client that ``app.contract.aredis.from_url`` made over TCP or a unix
socket, without TLS and without ``decode_responses`` (``lane_for``); anything else keeps
redis-py's path.
"""
from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import hiredis
from redis._parsers.base import BaseParser
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import ConnectionError, InvalidResponse, TimeoutError

_INCOMPLETE = object()


def _reader() -> hiredis.Reader:
    return hiredis.Reader(protocolError=InvalidResponse, replyError=BaseParser.parse_error,
                          notEnoughData=_INCOMPLETE)


class _Wire(asyncio.Protocol):
    """The connection: replies complete the queued futures in order."""

    def __init__(self, lane: "Lane") -> None:
        self.lane = lane
        self.transport: asyncio.Transport | None = None
        self.waiting: deque[asyncio.Future] = deque()
        self.reader = _reader()
        self.replies = 0            # replies read (the watchdog's sign of life)

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        reader, waiting = self.reader, self.waiting
        reader.feed(data)
        while True:
            try:
                reply = reader.gets()
            except InvalidResponse as exc:     # the stream is unreadable from here on
                self.fail(exc)
                return
            if reply is _INCOMPLETE:
                return
            self.replies += 1
            if not waiting:                    # a reply nobody asked for: out of step
                self.fail(InvalidResponse("Redis sent a reply no command asked for"))
                return
            fut = waiting.popleft()
            if fut.done():                     # its caller was cancelled
                continue
            if isinstance(reply, Exception):
                fut.set_exception(reply)
            else:
                fut.set_result(reply)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.fail(ConnectionError(f"Redis connection lost: {exc}" if exc else
                                  "Redis closed the connection"))

    def fail(self, exc: BaseException) -> None:
        """Fail every waiting call with ``exc`` and drop the connection."""
        waiting, self.waiting = self.waiting, deque()
        for fut in waiting:
            if not fut.done():
                fut.set_exception(exc)
        if self.transport is not None:
            self.transport.abort()
        self.lane._gone(self)


class Lane:
    """A pipelined connection to one Redis (see the module). ``address``: ``(host, port)``
    or a unix socket path; ``prelude``: packed commands sent first on every connection
    (AUTH, SELECT), each of which must answer +OK. It serves one event loop at a time: a
    call from another loop (tests run one after another) connects again for that loop."""

    def __init__(self, address: tuple[str, int] | str, *, timeout_s: float = 1.0,
                 connect_timeout_s: float = 1.0, prelude: list[bytes] | None = None) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.prelude = list(prelude or [])
        self._wire: _Wire | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connecting: asyncio.Future | None = None
        self._watch: asyncio.TimerHandle | None = None
        self._seen = -1
        self.connects = 0

    async def execute(self, packed: bytes) -> Any:
        """Send one packed command; its reply (an error reply raised as redis-py's
        exception)."""
        wire = self._wire
        if wire is None or self._loop is not asyncio.get_running_loop():
            wire = await self._connect()
        fut = self._loop.create_future()
        wire.waiting.append(fut)
        wire.transport.write(packed)
        if self._watch is None:
            self._seen = wire.replies
            self._watch = self._loop.call_later(self.timeout_s, self._check)
        return await fut

    def _check(self) -> None:
        """The watchdog: calls waiting and no reply since the last look -> the lane is
        stuck; fail them and drop the connection."""
        if asyncio.get_running_loop() is not self._loop:   # a loop the lane has left
            return
        self._watch = None
        wire = self._wire
        if wire is None or not wire.waiting:
            return
        if wire.replies == self._seen:
            wire.fail(TimeoutError(f"Redis did not answer within {self.timeout_s:g}s"))
            return
        self._seen = wire.replies
        self._watch = self._loop.call_later(self.timeout_s, self._check)

    def _gone(self, wire: _Wire) -> None:
        if self._wire is wire:
            self._wire = None

    async def _connect(self) -> _Wire:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:      # a new event loop (tests): the old connection is its
            self._wire, self._connecting, self._watch = None, None, None
            self._loop = loop
        if self._connecting is None:
            self._connecting = loop.create_task(self._open(loop))
        try:
            return await asyncio.shield(self._connecting)
        finally:
            if self._connecting is not None and self._connecting.done():
                self._connecting = None

    async def _open(self, loop: asyncio.AbstractEventLoop) -> _Wire:
        def make() -> _Wire:
            return _Wire(self)
        try:
            if isinstance(self.address, str):
                opening = loop.create_unix_connection(make, self.address)
            else:
                opening = loop.create_connection(make, *self.address)
            _, wire = await asyncio.wait_for(opening, self.connect_timeout_s)
        except asyncio.TimeoutError as exc:
            raise TimeoutError(f"Redis connect timed out ({self.address})") from exc
        except OSError as exc:
            raise ConnectionError(f"Redis connect failed ({self.address}): {exc}") from exc
        for packed in self.prelude:
            fut = loop.create_future()
            wire.waiting.append(fut)
            wire.transport.write(packed)
            try:
                await asyncio.wait_for(fut, self.timeout_s)
            except BaseException:
                wire.fail(ConnectionError("Redis connection setup failed"))
                raise
        self.connects += 1
        self._wire = wire
        return wire

    def close(self) -> None:
        wire, self._wire = self._wire, None
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if wire is not None and wire.transport is not None:
            wire.transport.close()


def lane_for(client: Any) -> Lane | None:
    """A lane to the Redis ``client`` (a ``redis.asyncio.Redis``) talks to, with its
    credentials and database; None where the lane cannot stand in for it (TLS, a
    ``decode_responses`` client, RESP3, a credential provider)."""
    pool = client.connection_pool
    kw = pool.connection_kwargs
    cls = pool.connection_class
    if kw.get("decode_responses") or kw.get("credential_provider") is not None \
            or kw.get("protocol") not in (None, 2, "2"):
        return None
    if issubclass(cls, UnixDomainSocketConnection):
        address: tuple[str, int] | str = kw["path"]
    elif issubclass(cls, Connection) and not issubclass(cls, SSLConnection):
        address = (kw.get("host") or "localhost", int(kw.get("port") or 6379))
    else:
        return None
    prelude = []
    password, username = kw.get("password"), kw.get("username")
    if password:
        prelude.append(hiredis.pack_command(("AUTH", username, password) if username
                                            else ("AUTH", password)))
    if int(kw.get("db") or 0):
        prelude.append(hiredis.pack_command(("SELECT", int(kw["db"]))))
    timeout = kw.get("socket_timeout") or 1.0
    return Lane(address, timeout_s=float(timeout),
                connect_timeout_s=float(kw.get("socket_connect_timeout") or timeout),
                prelude=prelude)
