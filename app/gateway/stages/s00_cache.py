"""S00_CACHE_PROBE: exact/semantic cache lookup. Not built yet: every request misses.

Interface for the cache: ``run`` either returns ``"S01_CASCADE_ROUTE"`` (miss) or sets
``ctx.cache`` ("exact" | "semantic") and ``ctx.cached_response`` (an OpenAI chat
completion dict) and returns ``"RESPOND"``; the gateway streams or returns it at cost 0.
Set ``ctx.collect_stream = True`` to have streamed answers assembled for ``on_complete``.
"""
from __future__ import annotations

from app.gateway.context import RequestContext


async def run(ctx: RequestContext) -> str:
    ctx.cache = "miss"
    return "S01_CASCADE_ROUTE"


async def on_complete(ctx: RequestContext, response: dict | None) -> None:
    """Called after a successful upstream answer (``response`` is the completion dict;
    None for a stream unless ``collect_stream`` was set). Write the cache here."""
    return None
