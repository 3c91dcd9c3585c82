"""Server-sent events exactly as OpenAI sends them: ``data: {json}\\n\\n`` ... ``data: [DONE]``.

The relay reads each upstream event as JSON (orjson, microseconds) and passes the
engine's bytes on unchanged; an event it cannot read (not a UTF-8 JSON object) is never
passed on: it ends the stream with an ``upstream_malformed`` error event. A failure after
the first byte ends the stream with an error event and ``[DONE]``, never a silent cut.
"""
from __future__ import annotations

import logging
from typing import AsyncIterator, Callable

import anyio
import orjson

from app.contract.cache.replay import assemble_stream
from app.gateway import http1
from app.gateway.context import RequestContext
from app.gateway.usage import counted_usage

log = logging.getLogger(__name__)
DONE = b"data: [DONE]\n\n"


def event(obj: dict) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def error_event(message: str, code: str, type_: str = "upstream_error") -> bytes:
    return event({"error": {"message": message, "type": type_, "param": None, "code": code}})


def collected_response(chunks: list[dict], usage: dict) -> dict:
    """The chat.completion a relayed stream amounts to (tool calls included)."""
    resp = assemble_stream(chunks)
    resp["usage"] = usage or None
    return resp


def _run_hooks(ctx: RequestContext, hooks: list, data: dict) -> dict | None:
    """Each hook may rewrite or drop (None) the chunk; a failing hook is dropped from the
    stream (the chunk passes on as it was) so the answer still reaches the client."""
    for hook in list(hooks):
        try:
            out = hook.chunk(data)
        except Exception:  # noqa: BLE001
            log.exception("request %s: stream hook %s failed", ctx.request_id,
                          type(hook).__name__)
            hooks.remove(hook)
            ctx.stage_errors.append(f"stream hook {type(hook).__name__} failed")
            continue
        if out is None:
            return None
        data = out
    return data


class MalformedStream(Exception):
    """An upstream event that is not a JSON object in UTF-8 (the relay ends the stream)."""


def _chunk(payload: bytes) -> dict | None:
    """The event's JSON object, or None when it is not one (bad UTF-8, bad JSON, not an
    object): the relay never passes bytes on that it could not read."""
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


async def relay(ctx: RequestContext, on_done: Callable[[RequestContext], None]
                ) -> AsyncIterator[bytes]:
    """Stream the open upstream response in ``ctx`` to the client, then call ``on_done``."""
    resp: http1.Response = ctx.upstream_response
    want_usage = ctx.include_usage
    collect: list[dict] | None = [] if ctx.collect_stream else None
    buf = b""
    saw_done = False
    failed = False
    chunk = ctx.first_chunk
    it = resp.sluice_iter
    hooks = list(ctx.stream_hooks)
    finished = False
    relayed: list[dict] = []   # the chunks the client got, as the engine wrote them

    def count_usage() -> None:
        """No usage chunk came (the stream ended early): book what was relayed."""
        if "completion_tokens" in (ctx.usage or {}) or not relayed or not ctx.tier:
            return
        try:
            ctx.usage = counted_usage(ctx, relayed)
            ctx.telemetry["usage_source"] = "counted"
        except Exception:  # noqa: BLE001 - the booking itself must still happen
            log.exception("request %s: counting the relayed usage failed", ctx.request_id)

    def finish() -> None:
        """Close the books before the last byte leaves (so a gateway killed after the
        client saw ``[DONE]`` has already spooled the ledger event), exactly once."""
        nonlocal finished
        if finished:
            return
        finished = True
        count_usage()
        if failed and ctx.services is not None and ctx.tier:
            ctx.services.metrics.stream_errors.labels(ctx.tier["name"]).inc()
        for hook in hooks:
            try:
                hook.done()
            except Exception:  # noqa: BLE001 - reporting only
                log.exception("request %s: stream hook done() failed", ctx.request_id)
        if collect is not None and not failed and ctx.status == 200:
            ctx.collected = collected_response(collect, ctx.usage)
        on_done(ctx)

    try:
        while True:
            if b"\r" in chunk:
                chunk = chunk.replace(b"\r\n", b"\n")
            buf += chunk
            if b"\n\n" in buf:
                *events, buf = buf.split(b"\n\n")
                out = []
                for ev in events:
                    if not ev or not ev.startswith(b"data:"):
                        continue   # blank, SSE comments and other fields: nothing to relay
                    payload = ev[5:].strip()
                    if payload == b"[DONE]":
                        saw_done = True
                        continue
                    data = _chunk(payload)
                    if data is None:
                        raise MalformedStream(payload[:80])
                    usage = data.get("usage")
                    if isinstance(usage, dict) and usage:
                        ctx.usage = usage
                        if not want_usage and not data.get("choices"):
                            continue
                    if "error" in data:
                        ctx.status, ctx.error = 502, "upstream_stream_error"
                        out.append(event(data))
                        continue
                    if hooks:
                        relayed.append(data)
                        data = _run_hooks(ctx, hooks, data)
                        if data is None:
                            continue
                        if collect is not None:
                            collect.append(data)
                        out.append(event(data))
                        continue
                    relayed.append(data)
                    if collect is not None:
                        collect.append(data)
                    out.append(b"data: " + payload + b"\n\n")
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
        finish()
        yield DONE
    except MalformedStream as exc:
        failed = True
        ctx.status, ctx.error = 502, "upstream_malformed"
        log.warning("request %s: upstream sent a malformed stream event: %r", ctx.request_id,
                    exc.args[0])
        yield error_event("The upstream sent a malformed stream.", "upstream_malformed")
        finish()
        yield DONE
    except (http1.HTTPClientError, OSError) as exc:
        failed = True
        ctx.status, ctx.error = 502, "upstream_disconnected"
        log.warning("request %s: upstream failed mid-stream: %r", ctx.request_id, exc)
        yield error_event("The upstream failed during the response.", "upstream_disconnected")
        finish()
        yield DONE
    except BaseException:
        # Client went away (cancelled): account what was served, then let it unwind.
        if ctx.status == 200 and not finished:
            ctx.status, ctx.error = 499, "client_closed"
        raise
    finally:
        finish()
        with anyio.CancelScope(shield=True):
            await resp.aclose()
