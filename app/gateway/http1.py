"""A lean HTTP/1.1 client for upstream calls: per-host LIFO keep-alive pools, one write
per request, responses parsed by httptools (C), bodies streamed as they arrive.

Why not httpx here: profiling the gateway showed httpcore's pool scanning every pooled
connection on each request (``is_idle``/``has_expired`` per connection), which grows
with concurrency, plus several socket writes per request. This client does what the
data path needs and nothing else: http and https (frontier APIs, verified with the
system CA store), Content-Length request bodies, Content-Length or chunked responses.
"""
from __future__ import annotations

import asyncio
import ssl
from collections import deque
from urllib.parse import urlsplit

import httptools


class HTTPClientError(Exception):
    pass


class ConnectError(HTTPClientError):
    pass


class Timeout(HTTPClientError):
    pass


class ReadError(HTTPClientError):
    """The connection broke or the response was malformed."""


class _Conn(asyncio.Protocol):
    def __init__(self, pool: "Pool", key: tuple[str, int, bool]) -> None:
        self.pool, self.key = pool, key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.headers: list[tuple[str, str]] = []
        self.chunks: deque[bytes] = deque()
        self.headers_done: asyncio.Future | None = None
        self.waiter: asyncio.Future | None = None
        self.complete = False
        self.error: Exception | None = None
        self.received = 0
        self.used = 0
        self.keep_alive = False

    # -- protocol
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ReadError(f"bad response from upstream: {exc}"))
            self.transport.close()

    def connection_lost(self, exc) -> None:
        if not self.complete:
            self._fail(ReadError(f"upstream closed the connection: {exc!r}"))
        self.pool._forget(self)

    # -- parser callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.decode("latin-1").lower(), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()  # only valid until the body ends
        if self.headers_done is not None and not self.headers_done.done():
            self.headers_done.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()

    # -- helpers
    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _fail(self, exc: Exception) -> None:
        self.error = exc
        if self.headers_done is not None and not self.headers_done.done():
            self.headers_done.set_exception(exc)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)

    def reset(self) -> None:
        self.headers = []  # the parser goes on to the next message of a kept-alive connection
        self.chunks.clear()
        self.complete = False
        self.error = None
        self.received = 0
        self.keep_alive = False
        self.headers_done = asyncio.get_running_loop().create_future()
        self.waiter = None

    @property
    def usable(self) -> bool:
        return self.transport is not None and not self.transport.is_closing() and self.error is None


class Response:
    def __init__(self, conn: _Conn, timeout: float) -> None:
        self._conn = conn
        self._timeout = timeout
        self.status_code = conn.parser.get_status_code()
        self.headers = dict(conn.headers)
        self.content = b""
        self._closed = False

    async def aiter_bytes(self):
        conn = self._conn
        while True:
            while conn.chunks:
                yield conn.chunks.popleft()
            if conn.complete:
                self._release()
                return
            if conn.error is not None:
                raise conn.error
            conn.waiter = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(conn.waiter, self._timeout)
            except asyncio.TimeoutError:
                await self.aclose()
                raise Timeout(f"upstream sent nothing for {self._timeout:g}s") from None
            finally:
                conn.waiter = None

    async def aread(self) -> bytes:
        self.content = b"".join([c async for c in self.aiter_bytes()])
        return self.content

    def _release(self) -> None:
        if self._closed:
            return
        self._closed = True
        conn = self._conn
        if conn.complete and conn.keep_alive and conn.usable:
            conn.pool._put(conn)
        elif conn.transport is not None:
            conn.transport.close()

    async def aclose(self) -> None:
        if not self._closed:
            if not self._conn.complete and self._conn.transport is not None:
                self._conn.transport.close()  # half-read: the connection cannot be reused
            self._release()


class Pool:
    def __init__(self, max_idle_per_host: int = 256, connect_timeout: float = 5.0,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.max_idle = max_idle_per_host
        self.connect_timeout = connect_timeout
        self._idle: dict[tuple[str, int, bool], list[_Conn]] = {}
        self._all: set[_Conn] = set()
        self._ssl = ssl_context  # None: the system CA store, built on first https use

    def _put(self, conn: _Conn) -> None:
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) >= self.max_idle:
            conn.transport.close()
        else:
            idle.append(conn)

    def _forget(self, conn: _Conn) -> None:
        self._all.discard(conn)
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    async def _connect(self, key: tuple[str, int, bool], timeout: float) -> _Conn:
        loop = asyncio.get_running_loop()
        tls = None
        if key[2]:
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            tls = self._ssl
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Conn(self, key), key[0], key[1], ssl=tls,
                                       server_hostname=key[0] if tls else None),
                min(timeout, self.connect_timeout))
        except asyncio.TimeoutError:
            raise Timeout(f"connect to {key[0]}:{key[1]} timed out") from None
        except (OSError, ssl.SSLError) as exc:
            raise ConnectError(f"cannot connect to {key[0]}:{key[1]}: {exc}") from exc
        self._all.add(conn)
        return conn

    def _take(self, key: tuple[str, int, bool]) -> _Conn | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.usable:
                return conn
        return None

    async def post(self, url: str, headers: dict[str, str], body: bytes,
                   timeout: float) -> Response:
        """Send; return once the response headers arrived (the body streams after)."""
        parts = urlsplit(url)
        https = parts.scheme == "https"
        key = (parts.hostname or "127.0.0.1", parts.port or (443 if https else 80), https)
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        head = [f"POST {path} HTTP/1.1\r\nhost: {parts.netloc}\r\n"]
        head += [f"{k}: {v}\r\n" for k, v in headers.items()]
        head.append(f"content-length: {len(body)}\r\n\r\n")
        payload = "".join(head).encode("latin-1") + body
        conn = self._take(key)
        for attempt in (0, 1):
            reused = conn is not None
            if conn is None:
                conn = await self._connect(key, timeout)
            conn.reset()
            conn.used += 1
            conn.transport.write(payload)
            try:
                await asyncio.wait_for(conn.headers_done, timeout)
                return Response(conn, timeout)
            except asyncio.TimeoutError:
                conn.transport.close()
                raise Timeout(f"no response from {key[0]}:{key[1]} in {timeout:g}s") from None
            except ReadError:
                conn.transport.close()
                # A pooled connection the server had already closed: retry once, fresh.
                if reused and conn.received == 0 and attempt == 0:
                    conn = None
                    continue
                raise
            except BaseException:
                conn.transport.close()
                raise
        raise ReadError("unreachable")

    async def aclose(self) -> None:
        for conn in list(self._all):
            if conn.transport is not None:
                conn.transport.close()
        self._idle.clear()
