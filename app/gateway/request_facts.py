"""What stages derive from the request and share, computed once: the request's one
embedding (S00's cache and S01's router), whether it asks for a JSON schema (S01's
features, S04's margin window), and the tier's tokenizer (S02's aliases, the relay's
counted usage)."""
from __future__ import annotations

from app.gateway.context import RequestContext

REFERENCE_ENGINE = "reference"   # the CPU reference engine: SmolLM2


def embedding(ctx: RequestContext):
    """The request's one embedding, computed on first need (cache or router)."""
    from app.contract.cache.embedding import embed, question_text
    if ctx.embedding is None:
        text = ctx.cache_key.text if ctx.cache_key is not None else question_text(
            ctx.body.get("messages") or [])
        ctx.embedding = embed(text, owner=(ctx.tenant or {}).get("id"))
    return ctx.embedding


def schema_present(body: dict) -> bool:
    rf = body.get("response_format")
    return isinstance(rf, dict) and rf.get("type") == "json_schema"


def tokenizer_name(ctx: RequestContext, tier=None) -> str:
    """Token counter for ``tier`` (the request's by default): the reference engine runs
    SmolLM2, external tiers count as cl100k, other pools by their model name."""
    tier = (ctx.tier if tier is None else tier) or {}
    if tier.get("upstream_kind") != "pool":
        return "cl100k_base"
    pool = ctx.snapshot.pools.get(str(tier.get("pool_id"))) or {}
    return pool_tokenizer(pool.get("engine"), pool.get("model") or tier.get("model") or "")


def pool_tokenizer(engine: str | None, model: str) -> str:
    """A pool's token counter: the reference engine runs SmolLM2, others by model name."""
    from app.contract.tokenizers import SMOLLM2, tokenizer_for_model
    return SMOLLM2 if engine == REFERENCE_ENGINE else tokenizer_for_model(model)
