"""S02_SCHEMA_MINIFY: rewrite verbose JSON-schema keys to _c1.._cN before decode.
Not built yet: both the stage and its fallback S02_PASSTHROUGH send the body as is.
A minifier sets ``ctx.upstream_body`` and ``ctx.key_map`` (minified -> original) for S05."""
from __future__ import annotations

from app.gateway.context import RequestContext


async def run(ctx: RequestContext) -> str:
    return await passthrough(ctx)


async def passthrough(ctx: RequestContext) -> str:
    ctx.upstream_body = ctx.body
    ctx.key_map = None
    return "S03_PREFILL"
