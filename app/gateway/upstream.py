"""OpenAI-compatible upstream calls over one keep-alive pool per gateway process."""
from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import orjson

from app.contract.secrets import pool_engine_key, provider_key
from app.gateway import http1

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                        "proxy-connection", "te", "trailer", "trailers", "transfer-encoding",
                        "upgrade"})
# Never forwarded up: the tenant's Sluice key, our own controls, framing we recompute.
_DROP_DOWN = frozenset({"content-length", "content-encoding", "server", "date"})
RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})


def strip_hop_by_hop(headers: dict[str, str]) -> dict[str, str]:
    """Remove RFC 9110 hop-by-hop headers, including any the Connection header lists."""
    listed = {h.strip().lower() for h in headers.get("connection", "").split(",") if h.strip()}
    return {k: v for k, v in headers.items() if k not in HOP_BY_HOP and k not in listed}


# Client headers that may reach an upstream: content negotiation and W3C trace context.
# Nothing else: no header can pick an engine behaviour, an organisation or a project.
FORWARDED_HEADERS = frozenset({"accept", "user-agent", "traceparent", "tracestate", "baggage"})


def upstream_request_headers(client_headers: dict[str, str], request_id: str,
                             api_key: str | None) -> dict[str, str]:
    out = {k: v for k, v in strip_hop_by_hop(client_headers).items()
           if k in FORWARDED_HEADERS}
    out["content-type"] = "application/json"
    out["accept-encoding"] = "identity"
    out["x-request-id"] = request_id
    if api_key:
        out["authorization"] = f"Bearer {api_key}"
    return out


def downstream_headers(upstream_headers: dict[str, str] | None) -> dict[str, str]:
    """Upstream response headers (lower-case names) fit to pass to the client."""
    return {k: v for k, v in strip_hop_by_hop(upstream_headers or {}).items()
            if k not in _DROP_DOWN}


def chat_url(base: str) -> str:
    base = base.rstrip("/")
    if base.endswith("/chat/completions"):
        return base
    return base + ("/chat/completions" if base.endswith("/v1") else "/v1/chat/completions")


class UpstreamError(Exception):
    """An upstream failed before the client saw a byte; ``retryable`` decides failover."""

    def __init__(self, message: str, *, kind: str, status: int = 0, body: bytes = b"",
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.kind = kind          # connect | timeout | status | protocol
        self.status = status
        self.body = body
        self.headers = headers
        self.retryable = kind != "status" or status in RETRY_STATUSES


class Upstream:
    """Pooled keep-alive connections to every upstream, plus passive ejection: a replica
    that just failed is skipped by new requests for ``eject_s`` seconds."""

    def __init__(self, *, keepalive: int = 256, eject_s: float = 5.0) -> None:
        self.pool = http1.Pool(max_idle_per_host=keepalive)
        self.eject_s = eject_s
        self._ejected: dict[str, float] = {}

    async def aclose(self) -> None:
        await self.pool.aclose()

    def eject(self, url: str) -> None:
        self._ejected[url] = time.monotonic() + self.eject_s

    def is_ejected(self, url: str) -> bool:
        until = self._ejected.get(url)
        if until is None:
            return False
        if until < time.monotonic():
            self._ejected.pop(url, None)
            return False
        return True

    @staticmethod
    def api_key(tier: Mapping[str, Any]) -> str | None:
        """The tier's key, read at call time so a rotated key needs no snapshot: a pool
        tier's engines' own key (derived from ``SLUICE_POOL_ENGINE_SECRET``, if set), an
        external tier's provider key (only a declared ``SLUICE_PROVIDER_KEY_*`` name is
        ever read; app.contract.secrets)."""
        if tier.get("upstream_kind") == "pool":
            return pool_engine_key(tier.get("pool_id"))
        return provider_key(tier.get("api_key_env"))

    async def open(self, url: str, headers: dict[str, str], body: dict,
                   timeout_s: float, stream: bool) -> http1.Response:
        """Send the request and return a response whose status is 2xx and, when
        streaming, whose first chunk has arrived (``response.sluice_first``, the rest
        from ``response.sluice_iter``). Raises UpstreamError for anything that fails
        before that: nothing has reached the client yet, so the caller may fail over."""
        try:
            resp = await self.pool.post(url, headers, orjson.dumps(body), timeout_s)
        except http1.Timeout as exc:
            raise UpstreamError(f"upstream timed out: {exc}", kind="timeout") from exc
        except http1.HTTPClientError as exc:
            raise UpstreamError(f"upstream unreachable: {exc}", kind="connect") from exc
        try:
            if resp.status_code >= 300:
                data = await resp.aread()
                raise UpstreamError(f"upstream answered {resp.status_code}", kind="status",
                                    status=resp.status_code, body=data, headers=resp.headers)
            if stream:
                it = resp.aiter_bytes()
                first = b""
                while not first:
                    first = await it.__anext__()
                resp.sluice_first = first
                resp.sluice_iter = it
            else:
                await resp.aread()
            return resp
        except UpstreamError:
            await resp.aclose()
            raise
        except StopAsyncIteration as exc:
            await resp.aclose()
            raise UpstreamError("upstream closed before the first byte",
                                kind="protocol") from exc
        except http1.Timeout as exc:
            await resp.aclose()
            raise UpstreamError(f"upstream timed out before the first byte: {exc}",
                                kind="timeout") from exc
        except http1.HTTPClientError as exc:
            await resp.aclose()
            raise UpstreamError(f"upstream failed before the first byte: {exc}",
                                kind="protocol") from exc
