"""Request cost from a tier's price table (USD per 1M tokens). Pure, exact (Decimal)."""
from __future__ import annotations

from decimal import Decimal
from typing import Any, Mapping, Sequence

MILLION = Decimal(1_000_000)
_PRICE_KEYS = ("price_input_per_m", "price_cached_input_per_m", "price_output_per_m")


def _price(prices: Mapping[str, Any], key: str) -> Decimal:
    raw = prices.get(key) or 0
    return raw if isinstance(raw, Decimal) else Decimal(str(raw))


def request_cost(prices: Mapping[str, Any], prompt_tokens: int, cached_tokens: int,
                 completion_tokens: int) -> Decimal:
    """(uncached_in * in + cached * cached_in + out * out) / 1e6.

    ``cached_tokens`` is the part of ``prompt_tokens`` the engine reused; it is clamped
    to [0, prompt_tokens] so a misreporting upstream can never make a cost negative.
    """
    prompt = max(int(prompt_tokens or 0), 0)
    cached = min(max(int(cached_tokens or 0), 0), prompt)
    out = max(int(completion_tokens or 0), 0)
    p_in, p_cached, p_out = (_price(prices, k) for k in _PRICE_KEYS)
    return ((prompt - cached) * p_in + cached * p_cached + out * p_out) / MILLION


def baseline_tier(tiers: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The frontier tier: the highest rank."""
    return max(tiers, key=lambda t: t["rank"], default=None)


def baseline_cost(tiers: Sequence[Mapping[str, Any]], prompt_tokens: int,
                  completion_tokens: int) -> Decimal:
    """What the same tokens would have cost on the frontier tier with no engine prefix
    reuse and no cache: the number savings are measured against."""
    top = baseline_tier(tiers)
    if top is None:
        return Decimal(0)
    return request_cost(top, prompt_tokens, 0, completion_tokens)
