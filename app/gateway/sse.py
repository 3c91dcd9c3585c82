"""Server-sent events exactly as OpenAI sends them: ``data: {json}\\n\\n`` ... ``data: [DONE]``.

The relay passes upstream events through whole, reading only what the ledger needs
(the usage chunk, found by a byte search before any JSON parse). A failure after the
first byte ends the stream with an error event and ``[DONE]``, never a silent cut.
"""
from __future__ import annotations

import logging
import time
from typing import AsyncIterator, Callable

import anyio
import orjson

from app.gateway import http1

from app.gateway.context import RequestContext

log = logging.getLogger(__name__)
DONE = b"data: [DONE]\n\n"


def event(obj: dict) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def error_event(message: str, code: str, type_: str = "upstream_error") -> bytes:
    return event({"error": {"message": message, "type": type_, "param": None, "code": code}})


def _collect(acc: dict, chunk: dict) -> None:
    acc.setdefault("id", chunk.get("id"))
    acc.setdefault("model", chunk.get("model"))
    acc.setdefault("created", chunk.get("created"))
    for ch in chunk.get("choices") or []:
        slot = acc.setdefault("choices", {}).setdefault(
            ch.get("index", 0), {"index": ch.get("index", 0),
                                 "message": {"role": "assistant", "content": ""},
                                 "finish_reason": None})
        delta = ch.get("delta") or {}
        if delta.get("content"):
            slot["message"]["content"] += delta["content"]
        if ch.get("finish_reason"):
            slot["finish_reason"] = ch["finish_reason"]


def collected_response(acc: dict, usage: dict) -> dict:
    return {"id": acc.get("id"), "object": "chat.completion", "created": acc.get("created"),
            "model": acc.get("model"),
            "choices": [acc["choices"][i] for i in sorted(acc.get("choices") or {})],
            "usage": usage or None}


async def relay(ctx: RequestContext, on_done: Callable[[RequestContext], None]
                ) -> AsyncIterator[bytes]:
    """Stream the open upstream response in ``ctx`` to the client, then call ``on_done``."""
    resp: http1.Response = ctx.upstream_response
    want_usage = ctx.include_usage
    collect: dict | None = {} if ctx.collect_stream else None
    buf = b""
    saw_done = False
    failed = False
    chunk = ctx.first_chunk
    it = resp.sluice_iter
    try:
        while True:
            if b"\r" in chunk:
                chunk = chunk.replace(b"\r\n", b"\n")
            buf += chunk
            if b"\n\n" in buf:
                *events, buf = buf.split(b"\n\n")
                out = []
                for ev in events:
                    if not ev:
                        continue
                    if ev.startswith(b"data: [DONE]") or ev.startswith(b"data:[DONE]"):
                        saw_done = True
                        continue
                    if b'"usage":{' in ev or b'"usage": {' in ev:
                        data = orjson.loads(ev[ev.index(b"{"):])
                        ctx.usage = data.get("usage") or ctx.usage
                        if not want_usage and not data.get("choices"):
                            continue
                    if ev.startswith(b'data: {"error"'):
                        ctx.status, ctx.error = 502, "upstream_stream_error"
                    elif collect is not None and ev.startswith(b"data:"):
                        _collect(collect, orjson.loads(ev[ev.index(b"{"):]))
                    out.append(ev + b"\n\n")
                if out:
                    yield b"".join(out)
            try:
                chunk = await it.__anext__()
            except StopAsyncIteration:
                break
        if not saw_done:
            failed = True
            ctx.status, ctx.error = 502, "upstream_truncated"
            yield error_event("The upstream ended the stream early.", "upstream_truncated")
        yield DONE
    except (http1.HTTPClientError, OSError) as exc:
        failed = True
        ctx.status, ctx.error = 502, "upstream_disconnected"
        log.warning("request %s: upstream failed mid-stream: %r", ctx.request_id, exc)
        yield error_event("The upstream failed during the response.", "upstream_disconnected")
        yield DONE
    except BaseException:
        # Client went away (cancelled): account what was served, then let it unwind.
        if ctx.status == 200:
            ctx.status, ctx.error = 499, "client_closed"
        raise
    finally:
        if failed and ctx.gw is not None and ctx.tier:
            ctx.gw.metrics.stream_errors.labels(ctx.tier["name"]).inc()
        if collect is not None and not failed and ctx.status == 200:
            ctx.collected = collected_response(collect, ctx.usage)
        on_done(ctx)
        with anyio.CancelScope(shield=True):
            await resp.aclose()


async def replay(response: dict, include_usage: bool) -> AsyncIterator[bytes]:
    """A complete chat.completion (a cache hit) as a chunk stream."""
    base = {"id": response.get("id"), "object": "chat.completion.chunk",
            "created": response.get("created") or int(time.time()),
            "model": response.get("model")}
    for ch in response.get("choices") or []:
        msg = ch.get("message") or {}
        yield event({**base, "choices": [{"index": ch.get("index", 0), "delta": {
            "role": "assistant", "content": msg.get("content") or ""},
            "logprobs": None, "finish_reason": None}]})
        yield event({**base, "choices": [{"index": ch.get("index", 0), "delta": {},
                                          "logprobs": None,
                                          "finish_reason": ch.get("finish_reason") or "stop"}]})
    if include_usage:
        yield event({**base, "choices": [], "usage": response.get("usage")})
    yield DONE
