"""The request pipeline as an explicit state table (seed 6.1).

======================  ==================================  ==========================  =====================
state                   does                                 may go to                   on exception
======================  ==================================  ==========================  =====================
S00_CACHE_PROBE         exact / semantic cache lookup        S01_CASCADE_ROUTE, RESPOND  S01_CASCADE_ROUTE
S01_CASCADE_ROUTE       choose the tier (calibrated router   S02_SCHEMA_MINIFY,          S01_DEFAULT_TIER2
                        for ``auto``)                        S01_DEFAULT_TIER2
S01_DEFAULT_TIER2       tier 2 (or the requested tier)       S02_SCHEMA_MINIFY           -
S02_SCHEMA_MINIFY       minify JSON-schema keys              S03_PREFILL                 S02_PASSTHROUGH
S02_PASSTHROUGH         send the body unchanged              S03_PREFILL                 -
S03_PREFILL             pick a replica (prefix affinity)     S04_DECODE                  S03_LOCAL_PREFILL
S03_LOCAL_PREFILL       any live replica, or escalate        S04_DECODE,                 -
                                                             S04_ESCALATE_TIER_UP
S04_DECODE              call upstream, fail over replicas;   S05_KEY_EXPAND, RESPOND,    S04_ESCALATE_TIER_UP
                        logprob-margin check (tier 1/2)      S04_MARGIN_ESCALATE
S04_MARGIN_ESCALATE     low margin: book the attempt, next   S03_PREFILL                 -
                        tier up
S04_ESCALATE_TIER_UP    next allowed tier up (502/504 when   S03_PREFILL                 -
                        there is none)
S05_KEY_EXPAND          expand minified keys; a schema       RESPOND, S04_DECODE         S98_ALERT_SCHEMA_ERR
                        error retries once unminified
S98_ALERT_SCHEMA_ERR    record the schema error, serve raw   RESPOND                     -
======================  ==================================  ==========================  =====================

A stage returns the name of the next state. A ``GatewayError`` (a decision about the
request: 403, 502 ...) ends the run as that error; any other exception takes the
state's fallback, so a broken stage degrades the request instead of losing it. A
fallback state that raises ends the run with a 500. Every visited state goes into
``ctx.trace`` and every fallback taken into ``ctx.fallbacks``.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Awaitable, Callable

from app.gateway.context import RequestContext
from app.gateway.errors import GatewayError
from app.gateway.stages import s00_cache, s01_route, s02_minify, s03_prefill, s04_decode, s05_expand
from app.gateway.upstream import UpstreamError

log = logging.getLogger(__name__)

START = "S00_CACHE_PROBE"
RESPOND = "RESPOND"
MAX_STEPS = 64


@dataclass(frozen=True)
class State:
    run: Callable[[RequestContext], Awaitable[str]]
    next: frozenset[str]
    fallback: str | None = None


def _s(run, *nxt: str, fallback: str | None = None) -> State:
    return State(run, frozenset(nxt), fallback)


TABLE: dict[str, State] = {
    "S00_CACHE_PROBE": _s(s00_cache.run, "S01_CASCADE_ROUTE", RESPOND,
                          fallback="S01_CASCADE_ROUTE"),
    "S01_CASCADE_ROUTE": _s(s01_route.run, "S02_SCHEMA_MINIFY", "S01_DEFAULT_TIER2",
                            fallback="S01_DEFAULT_TIER2"),
    "S01_DEFAULT_TIER2": _s(s01_route.default_tier2, "S02_SCHEMA_MINIFY"),
    "S02_SCHEMA_MINIFY": _s(s02_minify.run, "S03_PREFILL", fallback="S02_PASSTHROUGH"),
    "S02_PASSTHROUGH": _s(s02_minify.passthrough, "S03_PREFILL"),
    "S03_PREFILL": _s(s03_prefill.run, "S04_DECODE", fallback="S03_LOCAL_PREFILL"),
    "S03_LOCAL_PREFILL": _s(s03_prefill.local_prefill, "S04_DECODE", "S04_ESCALATE_TIER_UP"),
    "S04_DECODE": _s(s04_decode.run, "S05_KEY_EXPAND", RESPOND, "S04_MARGIN_ESCALATE",
                     fallback="S04_ESCALATE_TIER_UP"),
    "S04_MARGIN_ESCALATE": _s(s04_decode.margin_escalate, "S03_PREFILL"),
    "S04_ESCALATE_TIER_UP": _s(s04_decode.escalate, "S03_PREFILL"),
    "S05_KEY_EXPAND": _s(s05_expand.run, RESPOND, "S04_DECODE",
                         fallback="S98_ALERT_SCHEMA_ERR"),
    "S98_ALERT_SCHEMA_ERR": _s(s05_expand.alert_schema_error, RESPOND),
}


class PipelineError(RuntimeError):
    pass


async def run_pipeline(ctx: RequestContext, start: str = START,
                       table: dict[str, State] | None = None) -> None:
    """Drive ``ctx`` from ``start`` to RESPOND through ``table`` (default TABLE); raises
    GatewayError for an error answer."""
    table = TABLE if table is None else table
    state = start
    for _ in range(MAX_STEPS):
        if state == RESPOND:
            return
        spec = table[state]
        ctx.state = state
        ctx.trace.append(state)
        try:
            nxt = await spec.run(ctx)
        except GatewayError:
            raise
        except Exception as exc:  # noqa: BLE001 - degrade to the fallback, never drop the request
            if isinstance(exc, UpstreamError):
                ctx.last_error = exc
            ctx.stage_errors.append(f"{state}: {type(exc).__name__}: {exc}")
            if spec.fallback is None:
                log.exception("request %s: fallback state %s failed", ctx.request_id, state)
                raise GatewayError(500, "The gateway failed to serve the request.",
                                   code="pipeline_error", type_="api_error") from exc
            if not isinstance(exc, UpstreamError):
                log.warning("request %s: %s failed (%s), taking %s", ctx.request_id, state,
                            exc, spec.fallback)
            ctx.fallbacks.append(spec.fallback)
            if ctx.services is not None:
                ctx.services.metrics.fallbacks.labels(spec.fallback).inc()
            nxt = spec.fallback
        else:
            if nxt not in spec.next:
                raise PipelineError(f"{state} may not go to {nxt}")
        state = nxt
    raise GatewayError(500, "The request pipeline did not finish.", code="pipeline_loop",
                       type_="api_error")
