"""Ledger fields for what minification saved on one response (seed payload 6.2)."""
from __future__ import annotations

from app.contract.tokenizers import count_tokens


def output_token_savings(minified_text: str, expanded_text: str, tokenizer_name: str,
                         generated_tokens: int | None = None) -> dict[str, float | int]:
    """``generated_tokens`` is the engine's ``usage.completion_tokens`` when known; the raw
    equivalent adds what the original keys would have cost on top of it."""
    minified = count_tokens(minified_text, tokenizer_name)
    generated = minified if generated_tokens is None else generated_tokens
    raw = generated + max(0, count_tokens(expanded_text, tokenizer_name) - minified)
    return {"raw_schema_output_tokens_equivalent": raw,
            "minified_schema_tokens_generated": generated,
            "output_token_reduction_pct": round(100 * (1 - generated / raw), 1) if raw else 0.0}
