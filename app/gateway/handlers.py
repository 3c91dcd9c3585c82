"""Thin route handlers: admit (auth, size, validation, limits), run the pipeline, answer."""
from __future__ import annotations

import hmac
import logging
import uuid

import anyio
import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from app.contract.cache.replay import replay_as_sse_chunks, sse_lines
from app.core.workflow import workflow_signature
from app.gateway import kv_route, sse
from app.gateway.auth import authenticate
from app.gateway.budget import estimate_usd, reachable_tiers
from app.gateway.context import RequestContext
from app.gateway.errors import GatewayError
from app.gateway.feedback import parse_feedback, record_feedback
from app.gateway.pipeline import run_pipeline
from app.gateway.stages import s00_cache
from app.gateway.upstream import downstream_headers
from app.gateway.validation import check_chat_body, parse_json

log = logging.getLogger(__name__)
JSON = "application/json"


def _json(obj, status: int = 200, headers: dict | None = None) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type=JSON, headers=headers)


async def read_body(request: Request, limit: int) -> bytes:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise GatewayError(413, f"Request body is larger than {limit} bytes.",
                           code="request_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise GatewayError(413, f"Request body is larger than {limit} bytes.",
                               code="request_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


def _snapshot(gw):
    snap = gw.snapshots.current
    if snap is None:
        raise GatewayError(503, "The gateway has no configuration yet; try again shortly.",
                           code="no_snapshot")
    return snap


def resolve_model(snap, tenant: dict, model: str) -> dict | None:
    """The requested tier (None for ``auto``); 404 unknown, 403 not allowed."""
    if model == "auto":
        return None
    tier = snap.tiers_by_name.get(model)
    if tier is None:
        raise GatewayError(404, f"The model `{model}` does not exist or you do not have "
                           "access to it.", param="model", code="model_not_found")
    if tier not in snap.allowed_tiers(tenant):
        raise GatewayError(403, f"Tier `{model}` is not allowed for this tenant.",
                           param="model", code="tier_not_allowed")
    if not tenant["policy"]["allow_explicit_tier"]:
        raise GatewayError(403, "This tenant must use model `auto`.", param="model",
                           code="explicit_tier_not_allowed")
    return tier


async def _admit(gw, request: Request, rid: str) -> RequestContext:
    snap = _snapshot(gw)
    tenant, key = authenticate(snap, request.headers.get("authorization"))
    body = parse_json(await read_body(request, gw.max_body))
    policy = tenant["policy"]
    check_chat_body(body, int(policy["max_tokens_cap"]))
    tier = resolve_model(snap, tenant, body["model"])
    await gw.limiter.check(tenant)
    headers = request.headers
    sig, name = workflow_signature(tenant["id"], body, headers.get("x-sluice-workflow"))
    session = None
    if policy["session_key"] in ("header", "both"):
        session = headers.get("x-sluice-session") or headers.get("x-session-id")
    if session is None and policy["session_key"] in ("user", "both"):
        session = body.get("user") if isinstance(body.get("user"), str) else None
    opts = body.get("stream_options") or {}
    estimate = estimate_usd(body, reachable_tiers(snap.allowed_tiers(tenant), tier),
                            int(policy["max_tokens_cap"]))
    reserved, period = await gw.budget.reserve(tenant["id"], estimate, rid)
    return RequestContext(
        request_id=rid, snapshot=snap, tenant=tenant, key=key, body=body,
        client_headers=dict(headers), services=gw, requested_model=body["model"],
        requested_tier=tier, stream=bool(body.get("stream")),
        include_usage=bool(opts.get("include_usage")), workflow_signature=sig,
        workflow_name=name, workflow=snap.workflow(tenant["id"], sig), session_id=session,
        budget_reserved=reserved, budget_period=period)


def _sluice_headers(ctx: RequestContext, cost: bool) -> dict[str, str]:
    h = {"x-sluice-request-id": ctx.request_id, "x-sluice-cache": ctx.cache,
         "x-sluice-tier": (ctx.tier or {}).get("name", "") if ctx.cache == "miss" else "",
         "x-sluice-workflow": ctx.workflow_signature,
         # S04 decided before the first byte: a tier it aborted was replaced, never streamed
         "x-sluice-escalated": "true" if ctx.escalated else "false"}
    if cost and "cost_usd" in ctx.telemetry:
        h["x-sluice-cost-usd"] = f"{ctx.telemetry['cost_usd']:f}"
    return h


async def chat_completions(request: Request) -> Response:
    gw = request.app.state.gw
    rid = "req_" + uuid.uuid4().hex
    try:
        ctx = await _admit(gw, request, rid)
    except GatewayError as exc:
        gw.metrics.rejected.labels(str(exc.status), exc.code or "").inc()
        return exc.response({"x-sluice-request-id": rid})
    gw.metrics.in_flight.inc()
    streaming = False
    try:
        try:
            await run_pipeline(ctx)
        except GatewayError as exc:
            ctx.status, ctx.error = exc.status, exc.code or "error"
            gw.book(ctx)
            return exc.response(_sluice_headers(ctx, cost=False))
        if ctx.cached_response is not None:
            return await _respond_cached(gw, ctx)
        if ctx.status != 200:  # an upstream 4xx about the request, relayed
            gw.book(ctx)
            return Response(ctx.response_bytes, status_code=ctx.status, media_type=JSON,
                            headers=_sluice_headers(ctx, cost=False))
        if ctx.stream:
            streaming = True
            headers = {**downstream_headers(ctx.upstream_headers),
                       **_sluice_headers(ctx, cost=False), "cache-control": "no-cache",
                       "x-accel-buffering": "no"}
            headers.pop("content-type", None)
            return _Stream(ctx, gw, headers=headers)
        ctx.response_json = orjson.loads(ctx.response_bytes)
        ctx.usage = ctx.response_json.get("usage") or {}
        gw.book(ctx)
        await _after(ctx, ctx.response_json)
        headers = {**downstream_headers(ctx.upstream_headers), **_sluice_headers(ctx, True)}
        headers.pop("content-type", None)
        return Response(ctx.response_bytes, media_type=JSON, headers=headers)
    except Exception:
        log.exception("request %s failed", rid)
        if not streaming:
            ctx.status, ctx.error = 500, "internal_error"
            gw.book(ctx)
        return GatewayError(500, "The gateway failed to serve the request.",
                            code="internal_error", type_="api_error").response(
                                {"x-sluice-request-id": rid})
    finally:
        if not streaming:
            gw.metrics.in_flight.dec()


class _Stream(StreamingResponse):
    """The SSE relay, plus accounting for a client that left before the first chunk
    (the relay generator then never runs, so its ``finally`` cannot)."""

    def __init__(self, ctx: RequestContext, gw, headers: dict[str, str]) -> None:
        super().__init__(sse.relay(ctx, gw.book_stream), headers=headers,
                         media_type="text/event-stream")
        self.ctx, self.gw = ctx, gw

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self.ctx.telemetry.get("booked"):
                self.ctx.status, self.ctx.error = 499, "client_closed"
                self.gw.book_stream(self.ctx)
                with anyio.CancelScope(shield=True):
                    await self.ctx.upstream_response.aclose()


async def _after(ctx: RequestContext, response: dict | None) -> None:
    try:
        await s00_cache.on_complete(ctx, response)
    except Exception:  # noqa: BLE001 - a cache write never fails the answer
        log.exception("request %s: cache on_complete failed", ctx.request_id)


def _replay(ctx: RequestContext):
    """A cached completion as the chunk stream the client asked for (usage chunk only
    with ``include_usage``); chunk ids name this request."""
    chunks = replay_as_sse_chunks(ctx.cached_response, ctx.requested_model, ctx.request_id)
    if not ctx.include_usage:
        chunks = [c for c in chunks if c.get("choices")]
    return sse_lines(chunks)


async def _respond_cached(gw, ctx: RequestContext) -> Response:
    ctx.usage = ctx.cached_response.get("usage") or {}
    gw.book(ctx)
    if ctx.stream:
        return StreamingResponse(_replay(ctx),
                                 media_type="text/event-stream",
                                 headers={**_sluice_headers(ctx, cost=True),
                                          "cache-control": "no-cache"})
    return _json(ctx.cached_response, headers=_sluice_headers(ctx, cost=True))


async def list_models(request: Request) -> Response:
    gw = request.app.state.gw
    try:
        snap = _snapshot(gw)
        tenant, _ = authenticate(snap, request.headers.get("authorization"))
    except GatewayError as exc:
        return exc.response()
    names = ["auto"]
    if tenant["policy"]["allow_explicit_tier"]:
        names += [t["name"] for t in snap.allowed_tiers(tenant)]
    return _json({"object": "list", "data": [
        {"id": n, "object": "model", "created": 0, "owned_by": "sluice"} for n in names]})


async def feedback(request: Request) -> Response:
    gw = request.app.state.gw
    try:
        snap = _snapshot(gw)
        tenant, _ = authenticate(snap, request.headers.get("authorization"))
        rid, passed, note = parse_feedback(parse_json(await read_body(request, 64 * 1024)))
        try:
            ev = await record_feedback(gw.redis, gw.keys, tenant["id"], rid, passed, note)
        except GatewayError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise GatewayError(503, "Feedback store unavailable; retry.",
                               code="feedback_unavailable") from exc
    except GatewayError as exc:
        return exc.response()
    evicted = False
    if not passed:
        try:
            evicted = await s00_cache.evict_for_feedback(gw, rid)
        except Exception:  # noqa: BLE001 - the verdict is recorded; eviction is best effort
            log.exception("feedback %s: cache eviction failed", rid)
    else:
        try:  # a validator passed it: the answer may now serve paraphrases
            await s00_cache.verify_for_feedback(gw, rid)
        except Exception:  # noqa: BLE001 - the verdict is recorded; this is best effort
            log.exception("feedback %s: cache verification failed", rid)
    return _json({"object": "feedback", "request_id": rid, "pass": ev["pass"],
                  "recorded_at": ev["at"], "cache_evicted": evicted}, status=202)


def _operator(request: Request) -> bool:
    """Whether the caller may read the gateway's internals: the bearer token of
    GATEWAY_METRICS_TOKEN when one is set, else only a client on this host (the port is
    the tenants' too)."""
    token = request.app.state.gw.config["GATEWAY_METRICS_TOKEN"]
    if token:
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        return hmac.compare_digest(given.encode(), token.encode())
    host = request.client.host if request.client else ""
    return host in ("127.0.0.1", "::1", "localhost")


async def metrics(request: Request) -> Response:
    if not _operator(request):
        return _json({"error": {"message": "metrics are for operators", "type":
                                "invalid_request_error", "param": None, "code": "forbidden"}},
                     status=403)
    gw = request.app.state.gw
    return Response(generate_latest(gw.metrics.registry), media_type=CONTENT_TYPE_LATEST)


async def healthz(request: Request) -> Response:
    gw = request.app.state.gw
    snap = gw.snapshots.current
    body = {"ok": snap is not None, "snapshot_version": snap.version if snap else None,
            "redis": gw.snapshots.redis_ok, "ledger_backlog": len(gw.ledger.queue),
            "ledger_written": gw.ledger.written, "ledger_recovered": gw.ledger.recovered,
            "ledger_spilled": gw.ledger.spilled, "ledger_spilling": gw.ledger.spill_at is not None,
            "ledger_dropped": gw.ledger.dropped, "instance": gw.instance,
            "budget_unsettled": len(gw.budget.unsettled),
            "reloads": gw.snapshots.reloads,
            "router_version": gw.routers.version, "routers": gw.routers.versions(),
            "kv_tokenizers": kv_route.tokenizer_states()}
    if not _operator(request):   # a load balancer needs only whether to send traffic here
        body = {"ok": body["ok"]}
    return _json(body, status=200 if snap is not None else 503)
