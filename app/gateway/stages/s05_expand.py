"""S05_KEY_EXPAND: map minified keys back (``ctx.key_map``) in the answer. With no
minifier yet there is nothing to expand. Fallback S98_ALERT_SCHEMA_ERR records the
schema error and serves the answer unexpanded rather than lose it."""
from __future__ import annotations

import logging

from app.gateway.context import RequestContext

log = logging.getLogger(__name__)


async def run(ctx: RequestContext) -> str:
    if ctx.key_map:
        raise NotImplementedError("key expansion lands with the minifier")
    return "RESPOND"


async def alert_schema_error(ctx: RequestContext) -> str:
    log.error("request %s: schema key expansion failed: %s", ctx.request_id,
              ctx.stage_errors[-1] if ctx.stage_errors else "")
    ctx.telemetry["schema_error"] = True
    if ctx.gw is not None:
        ctx.gw.metrics.schema_errors.inc()
    return "RESPOND"
