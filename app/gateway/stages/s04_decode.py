"""S04_DECODE: call the upstream. Fails over to the tier's other replicas while nothing
has reached the client; when the tier has none left it raises, and the fallback
S04_ESCALATE_TIER_UP moves to the next tier up the tenant may use (then S03 again).
A non-retryable upstream answer (a 4xx about the request) is relayed as is.

On tier 1, the body names the request's LoRA adapter when the replica loaded it
(``app.gateway.adapters``; ``ctx.adapter``). A routed tier-1/2 attempt is also judged
on its logprob margin (``s04_margin``); a low margin books the attempt and goes to
S04_MARGIN_ESCALATE (the next tier up, then S03). A streamed answer of a request whose tools retrieval trimmed
is held while it is a tool call (``tool_retrieval.hold_tool_calls``), and sent again with
the full set when the call needs it, before any byte reaches the client."""
from __future__ import annotations

import logging

from app.gateway.context import RequestContext
from app.gateway.errors import GatewayError
from app.gateway import adapters, replicas, shadow, tool_retrieval, traces
from app.gateway.stages import s04_margin
from app.gateway.upstream import UpstreamError, chat_url, upstream_request_headers

log = logging.getLogger(__name__)
TOOL_RETRY = "tool_retry"   # _attempt: a held streamed tool call needs the full tool set


_RETRIES = ("schema_retry", "tool_retry")


async def served_form(ctx: RequestContext) -> None:
    """Before an attempt, once ``ctx.adapter`` names its adapter: an adapter is served in
    the form it learned (``app.adapters.served_form``), whatever the tenant's policy gives
    the request now. When the attempt's
    adapter learned another form than S02 gave, ``ctx.upstream_body`` / ``ctx.minify`` /
    ``ctx.key_map`` become that form's (S05 expands the answer with it, so the client gets
    its own keys either way); an attempt after it without that adapter (another replica, a
    higher tier) gets S02's back. A retry that rewrote the body (schema, tool set) keeps
    its own. Telemetry ``served_form``: "adapter" or "policy" once it differed."""
    from app.gateway.stages import s02_minify
    if any(a["reason"] in _RETRIES for a in ctx.attempts):
        return
    form = adapters.form_of(ctx, ctx.adapter)
    want = form is not None and s02_minify.form_applies(ctx, form)
    if ctx.form_swap is None:
        if not want:
            return
        import anyio
        trained = await anyio.to_thread.run_sync(s02_minify.trained_form, ctx, form)
        ctx.form_swap = ((ctx.upstream_body, ctx.minify), trained)
    routed, trained = ctx.form_swap
    ctx.upstream_body, ctx.minify = trained if want else routed
    ctx.key_map = ctx.minify.keymap if ctx.minify is not None else None
    ctx.telemetry["served_form"] = "adapter" if want else "policy"


def upstream_body(ctx: RequestContext, margin: bool = False) -> dict:
    body = dict(ctx.upstream_body or ctx.body)
    if margin:
        s04_margin.ask_logprobs(body)
    body["model"] = ctx.adapter or ctx.snapshot.served_model(ctx.tier)
    if ctx.stream and (adapters.shadow_for(ctx) is not None or traces.candidate(ctx)
                       or shadow.may_explore(ctx)):
        ctx.collect_stream = True  # a shadow run, exploration or a trace needs the answer
    if ctx.stream:
        # Always ask for usage: the ledger needs it; S05/relay drops it if the client didn't.
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    if ctx.tier.get("upstream_kind") == "pool":
        salt = replicas.salt(ctx)
        if salt:
            body["cache_salt"] = salt
    elif "structured_outputs" in body and ctx.minify is not None and ctx.minify.compact:
        # escalated from a pool to an external tier: an OpenAI API takes no grammar
        body.pop("structured_outputs")
        body["response_format"] = ctx.minify.response_format
        body["messages"] = ctx.minify.messages   # without the pool's style hint
    return body


async def _attempt(ctx: RequestContext) -> str:
    """One upstream call; returns the margin decision ("pass" when not monitored)."""
    services, tier, replica = ctx.services, ctx.tier, ctx.replica
    headers = upstream_request_headers(ctx.client_headers, ctx.request_id,
                                       services.upstream.api_key(tier))
    watch = s04_margin.applies(ctx)
    ctx.adapter = adapters.adapter_for(ctx)
    await served_form(ctx)
    body = upstream_body(ctx, margin=watch)
    await services.track_replica(ctx, replica.get("id"))
    resp = await services.upstream.open(chat_url(replica["url"]), headers, body,
                                  float(tier.get("timeout_s") or 60.0), ctx.stream)
    ctx.ttft_ms = ctx.elapsed_ms()
    ctx.upstream_status = resp.status_code
    ctx.upstream_headers = resp.headers
    if ctx.stream:
        ctx.upstream_response = resp
        ctx.first_chunk = resp.sluice_first
        services.prefilled(ctx)      # the first chunk came: the replica has prefilled it
        decision = s04_margin.PASS
        if watch:
            decision = await s04_margin.hold_stream(ctx, resp, s04_margin.monitor(ctx), body)
            ctx.ttft_ms = ctx.elapsed_ms()  # the client's first byte waits for the decision
        if decision == s04_margin.PASS and tool_retrieval.hold_applies(ctx):
            if await tool_retrieval.hold_tool_calls(ctx, resp):
                return TOOL_RETRY
            ctx.ttft_ms = ctx.elapsed_ms()
        return decision
    ctx.response_bytes = resp.content
    await resp.aclose()
    if not watch:
        return s04_margin.PASS
    return s04_margin.judge_response(ctx, s04_margin.monitor(ctx))


async def run(ctx: RequestContext) -> str:
    while True:
        try:
            decision = await _attempt(ctx)
            if decision == TOOL_RETRY:
                await _tool_retry(ctx)
                continue
            if decision == s04_margin.ESCALATE:
                return "S04_MARGIN_ESCALATE"
            return "S05_KEY_EXPAND"
        except UpstreamError as exc:
            ctx.last_error = exc
            if not exc.retryable:
                ctx.status = exc.status
                ctx.error = f"upstream_{exc.status}"
                ctx.response_bytes = exc.body
                ctx.upstream_headers = exc.headers
                return "RESPOND"
            url = ctx.replica["url"]
            log.warning("request %s: %s on %s (tier %s)", ctx.request_id, exc, url,
                        ctx.tier["name"])
            ctx.failed_replicas.add(url)
            ctx.services.upstream.eject(url)
            ctx.services.metrics.upstream_failure(ctx.tier["name"], exc.kind)
            ctx.telemetry.setdefault("retries", []).append(
                {"tier": ctx.tier["name"], "replica": ctx.replica.get("name"), "error": exc.kind})
            remaining = adapters.replicas_for(ctx, replicas.live_replicas(ctx,
                                                                          healthy_only=False))
            if not remaining:
                raise
            ctx.replica = replicas.pick(ctx, remaining)


async def _tool_retry(ctx: RequestContext) -> None:
    """A held streamed tool call needs the full set (``tool_retrieval.hold_tool_calls``):
    book the attempt and send the request again, as S05 does for a complete answer."""
    import anyio
    ctx.record_attempt("tool_retry")
    ctx.upstream_body = ctx.tools_body = tool_retrieval.full_set_body(ctx)
    ctx.minify = ctx.key_map = None
    ctx.upstream_response, ctx.first_chunk = None, b""
    await anyio.to_thread.run_sync(tool_retrieval.count_definitions, ctx)


def _gateway_error(exc: Exception | None) -> GatewayError:
    if isinstance(exc, UpstreamError) and exc.kind == "timeout":
        return GatewayError(504, "The upstream model timed out.", code="upstream_timeout")
    return GatewayError(502, "No upstream could serve the request.", code="upstream_unavailable")


async def escalate(ctx: RequestContext) -> str:
    rank = ctx.tier["rank"]
    higher = [t for t in ctx.snapshot.allowed_tiers(ctx.tenant) if t["rank"] > rank]
    if not higher:
        raise _gateway_error(ctx.last_error)
    ctx.telemetry.setdefault("escalations", []).append(
        {"from": ctx.tier["name"], "to": higher[0]["name"], "reason": "upstream_failure"})
    ctx.tier = higher[0]
    ctx.escalated = True
    ctx.replica = None
    return "S03_PREFILL"


async def margin_escalate(ctx: RequestContext) -> str:
    """The attempt's margin was below γ: book it (its cost and margin stay in the
    ledger's attempts) and move to the next tier up (S04 only watches attempts that
    have one)."""
    rank = ctx.tier["rank"]
    higher = [t for t in ctx.snapshot.allowed_tiers(ctx.tenant) if t["rank"] > rank]
    ctx.record_attempt("low_margin")
    ctx.attempts[-1]["margin"] = ctx.margin
    ctx.upstream_response, ctx.first_chunk, ctx.response_bytes = None, b"", b""
    ctx.telemetry.setdefault("escalations", []).append(
        {"from": ctx.tier["name"], "to": higher[0]["name"], "reason": "low_margin",
         "margin": ctx.margin})
    ctx.telemetry.setdefault("escalated_from", []).append(rank)
    ctx.tier = higher[0]
    ctx.escalated = True
    ctx.replica = None
    ctx.margin = None  # the served attempt's margin, if it is watched too
    return "S03_PREFILL"
