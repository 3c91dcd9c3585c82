"""What stages derive from the request and share, computed once: the request's one
embedding (S00's cache and S01's router) and whether it asks for a JSON schema (S01's
features, S04's margin window)."""
from __future__ import annotations

from app.gateway.context import RequestContext


def embedding(ctx: RequestContext):
    """The request's one embedding, computed on first need (cache or router)."""
    from app.contract.cache.embedding import embed, question_text
    if ctx.embedding is None:
        text = ctx.cache_key.text if ctx.cache_key is not None else question_text(
            ctx.body.get("messages") or [])
        ctx.embedding = embed(text)
    return ctx.embedding


def schema_present(body: dict) -> bool:
    rf = body.get("response_format")
    return isinstance(rf, dict) and rf.get("type") == "json_schema"
