"""Server-sent events exactly as OpenAI sends them: ``data: {json}\\n\\n`` ... ``data: [DONE]``.

The relay passes upstream events through whole, reading only what the ledger needs
(the usage chunk, found by a byte search before any JSON parse). A failure after the
first byte ends the stream with an error event and ``[DONE]``, never a silent cut.
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
    relayed: list[bytes | dict] = []   # what the client got, as the engine wrote it

    def count_usage() -> None:
        """No usage chunk came (the stream ended early): book what was relayed."""
        if "completion_tokens" in (ctx.usage or {}) or not relayed or not ctx.tier:
            return
        try:
            events = [orjson.loads(e[e.index(b"{"):]) if isinstance(e, bytes) else e
                      for e in relayed]
            ctx.usage = counted_usage(ctx, events)
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
                    if not ev:
                        continue
                    if ev.startswith(b"data: [DONE]") or ev.startswith(b"data:[DONE]"):
                        saw_done = True
                        continue
                    if hooks and ev.startswith(b"data:") and not ev.startswith(b'data: {"error"'):
                        data = orjson.loads(ev[ev.index(b"{"):])
                        if data.get("usage"):
                            ctx.usage = data["usage"]
                            if not want_usage and not data.get("choices"):
                                continue
                        relayed.append(data)
                        data = _run_hooks(ctx, hooks, data)
                        if data is None:
                            continue
                        if collect is not None:
                            collect.append(data)
                        out.append(event(data))
                        continue
                    if b'"usage":{' in ev or b'"usage": {' in ev:
                        data = orjson.loads(ev[ev.index(b"{"):])
                        ctx.usage = data.get("usage") or ctx.usage
                        if not want_usage and not data.get("choices"):
                            continue
                    if ev.startswith(b'data: {"error"'):
                        ctx.status, ctx.error = 502, "upstream_stream_error"
                    elif ev.startswith(b"data:"):
                        relayed.append(ev)
                        if collect is not None:
                            collect.append(orjson.loads(ev[ev.index(b"{"):]))
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
