"""S04's logprob-margin check (seed S04, drill CD-28B), for routed (``auto``) tier-1/2
attempts that have a tier above them: the upstream is asked for ``logprobs`` with
``top_logprobs=2`` and ``app.core.margin.MarginMonitor`` decides on the first
``margin_window_tokens`` value tokens (JSON values when a schema is set) whether the
mean margin reaches ``margin_gamma``.

Non-streaming, the whole answer is judged at once. Streaming, the upstream stream is
held (``HeldStream``: no byte goes to the client) until the monitor decides: on "pass"
the held bytes become the relay's first chunk and the rest streams on; on "escalate"
the upstream is closed and S04_MARGIN_ESCALATE re-runs on the next tier. Logprobs the
client did not ask for are removed from what it receives.
"""
from __future__ import annotations

import math

import orjson

from app.core.margin import ESCALATE, PASS, UNDECIDED, HeldStream, MarginMonitor, logprob_items
from app.gateway import http1
from app.gateway.budget import estimate_prompt_tokens
from app.gateway.context import RequestContext
from app.gateway.request_facts import schema_present
from app.gateway.upstream import UpstreamError

MAX_HELD_BYTES = 1 << 20   # past this much held output, decide on what was seen
TOP_LOGPROBS = 2


def applies(ctx: RequestContext) -> bool:
    """Routed request, one choice, tier 1 or 2, and a higher tier the tenant may use."""
    tier = ctx.tier or {}
    if ctx.requested_tier is not None or tier.get("rank") not in (1, 2):
        return False
    if int(ctx.body.get("n") or 1) != 1:
        return False
    return any(t["rank"] > tier["rank"] for t in ctx.snapshot.allowed_tiers(ctx.tenant))


def gamma(ctx: RequestContext) -> float:
    """The tier's calibrated γ (``flask sluice calibrate-gamma``), else the policy's."""
    own = (ctx.tier or {}).get("margin_gamma")
    return float(ctx.policy["margin_gamma"] if own is None else own)


def monitor(ctx: RequestContext) -> MarginMonitor:
    p = ctx.policy
    return MarginMonitor(gamma(ctx),
                         int(p["margin_window_tokens"]),
                         schema=schema_present(ctx.body))


def ask_logprobs(body: dict) -> None:
    body["logprobs"] = True
    body["top_logprobs"] = max(TOP_LOGPROBS, int(body.get("top_logprobs") or 0))


def client_wants_logprobs(ctx: RequestContext) -> bool:
    return bool(ctx.body.get("logprobs"))


def _strip(data: dict) -> dict:
    for ch in data.get("choices") or []:
        if isinstance(ch, dict) and "logprobs" in ch:
            ch["logprobs"] = None
    return data


class StripLogprobs:
    """Relay hook: drop logprobs the gateway asked for and the client did not."""

    def chunk(self, data: dict) -> dict:
        return _strip(data)

    def done(self) -> None:
        pass


def _record_margin(ctx: RequestContext, mon: MarginMonitor) -> None:
    m = mon.margin  # NaN when no value token was seen (then the monitor used all tokens)
    ctx.margin = None if math.isnan(m) else round(m, 4)
    ctx.telemetry.setdefault("margin_checks", []).append(
        {"tier": ctx.tier["name"], "margin": ctx.margin, "tokens": mon.tokens,
         "value_tokens": mon.value_tokens, "decision": mon.decision})


def judge_response(ctx: RequestContext, mon: MarginMonitor) -> str:
    """Decide on a complete (non-streamed) answer; strips unrequested logprobs on pass."""
    data = orjson.loads(ctx.response_bytes)
    mon.feed(logprob_items(data))
    decision = mon.finish()
    _record_margin(ctx, mon)
    if decision == ESCALATE:
        ctx.usage = data.get("usage") or {}
        return decision
    if not client_wants_logprobs(ctx):
        ctx.response_bytes = orjson.dumps(_strip(data))
    return decision


def _push_events(ctx: RequestContext, held: HeldStream, events: list[bytes],
                 released: list[bytes]) -> str:
    """Feed whole SSE events to ``held``; what it releases is appended to ``released``."""
    decision = held.monitor.decision
    for ev in events:
        if not ev:
            continue
        items = []
        if ev.startswith(b"data:") and b"{" in ev:
            data = orjson.loads(ev[ev.index(b"{"):])
            items = logprob_items(data)
            if data.get("usage"):
                ctx.usage = data["usage"]
        decision, out = held.push(ev + b"\n\n", items)
        released += out
        if decision == ESCALATE:
            break
    return decision


async def hold_stream(ctx: RequestContext, resp: http1.Response, mon: MarginMonitor,
                      body: dict) -> str:
    """Read the open stream until the monitor decides. Pass: ``ctx.first_chunk`` holds
    every byte read so far (the relay sends it first). Escalate: the upstream is closed.
    A failure while holding is an UpstreamError: nothing reached the client."""
    held = HeldStream(mon)
    buf, it = resp.sluice_first, resp.sluice_iter
    size = len(buf)
    released: list[bytes] = []
    decision = UNDECIDED
    try:
        while decision == UNDECIDED:
            if b"\r" in buf:
                buf = buf.replace(b"\r\n", b"\n")
            *events, buf = buf.split(b"\n\n")
            decision = _push_events(ctx, held, events, released)
            if decision != UNDECIDED:
                break
            if size > MAX_HELD_BYTES:
                decision, out = held.end()
                released += out
                break
            try:
                chunk = await it.__anext__()
                size += len(chunk)
                buf += chunk
            except StopAsyncIteration:
                decision, out = held.end()
                released += out
    except http1.Timeout as exc:
        await resp.aclose()
        raise UpstreamError(f"upstream timed out while held: {exc}", kind="timeout") from exc
    except (http1.HTTPClientError, OSError, orjson.JSONDecodeError) as exc:
        await resp.aclose()
        raise UpstreamError(f"upstream failed while held: {exc}", kind="protocol") from exc
    _record_margin(ctx, mon)
    if decision == PASS:
        ctx.first_chunk = b"".join(released) + buf
        if not client_wants_logprobs(ctx) and not any(
                isinstance(h, StripLogprobs) for h in ctx.stream_hooks):
            ctx.stream_hooks.append(StripLogprobs())
        return PASS
    await resp.aclose()
    if not ctx.usage:  # aborted before the usage chunk: what the engine did, estimated
        ctx.usage = {"prompt_tokens": estimate_prompt_tokens(body),
                     "completion_tokens": mon.tokens}
        ctx.telemetry["aborted_usage_estimated"] = True
    return ESCALATE
