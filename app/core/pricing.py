"""Request cost from a tier's price table (USD per 1M tokens). Pure, exact (Decimal).

A tier from the config snapshot may carry a ``price_schedule``: its effective-dated price
changes (``app.finops.models.TierPrice``), each ``{"from_ts": epoch seconds,
"price_input_per_m", "price_cached_input_per_m", "price_output_per_m"}``, sorted by
``from_ts``. The tier's own prices apply before the first change; a change applies from
its instant on. Every booking prices a request at the instant it is booked
(``book_cost``), so a price change takes effect at its date without a config push.
"""
from __future__ import annotations

import time
from datetime import datetime
from decimal import Decimal
from typing import Any, Iterable, Mapping, Sequence

MILLION = Decimal(1_000_000)
_PRICE_KEYS = ("price_input_per_m", "price_cached_input_per_m", "price_output_per_m")


def _price(prices: Mapping[str, Any], key: str) -> Decimal:
    raw = prices.get(key) or 0
    return raw if isinstance(raw, Decimal) else Decimal(str(raw))


def _epoch(at: datetime | float | None) -> float:
    if at is None:
        return time.time()
    return at.timestamp() if isinstance(at, datetime) else float(at)


def tier_with_schedule(tier: Mapping[str, Any], changes: Iterable[Mapping[str, Any]] = ()
                       ) -> dict[str, Any]:
    """``tier`` (any other keys kept) with its own prices as Decimals and a
    ``price_schedule`` built from ``changes``: TierPrice-shaped rows with an
    ``effective_from`` datetime, sorted by it. Each entry keeps its ``effective_from``
    next to the ``from_ts`` the lookups use."""
    rows = sorted(changes, key=lambda c: c["effective_from"])
    return {**tier, **{k: _price(tier, k) for k in _PRICE_KEYS},
            "price_schedule": [{"from_ts": c["effective_from"].timestamp(),
                                "effective_from": c["effective_from"],
                                **{k: _price(c, k) for k in _PRICE_KEYS}} for c in rows]}


def prices_at(tier: Mapping[str, Any], at: datetime | float | None = None) -> Mapping[str, Any]:
    """The per-1M prices of ``tier`` in force at ``at`` (a datetime or epoch seconds;
    None: now): the last ``price_schedule`` entry with ``from_ts <= at``, else the tier's
    own prices."""
    schedule = tier.get("price_schedule") or ()
    if not schedule:
        return tier
    ts = _epoch(at)
    current: Mapping[str, Any] = tier
    for change in schedule:
        if float(change["from_ts"]) <= ts:
            current = change
        else:
            break
    return current


def request_cost(prices: Mapping[str, Any], prompt_tokens: int, cached_tokens: int,
                 completion_tokens: int) -> Decimal:
    """(uncached_in * in + cached * cached_in + out * out) / 1e6.

    ``cached_tokens`` is the part of ``prompt_tokens`` the engine reused; it is clamped
    to [0, prompt_tokens] so a misreporting upstream can never make a cost negative.
    ``prices`` is a price table (a tier's own prices or one schedule entry); use
    ``tier_cost`` for a tier at an instant.
    """
    prompt = max(int(prompt_tokens or 0), 0)
    cached = min(max(int(cached_tokens or 0), 0), prompt)
    out = max(int(completion_tokens or 0), 0)
    p_in, p_cached, p_out = (_price(prices, k) for k in _PRICE_KEYS)
    return ((prompt - cached) * p_in + cached * p_cached + out * p_out) / MILLION


def tier_cost(tier: Mapping[str, Any], at: datetime | float | None, prompt_tokens: int,
              cached_tokens: int, completion_tokens: int) -> Decimal:
    """``request_cost`` at the tier's price in force at ``at``."""
    return request_cost(prices_at(tier, at), prompt_tokens, cached_tokens, completion_tokens)


def baseline_tier(tiers: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The frontier tier: the highest rank."""
    return max(tiers, key=lambda t: t["rank"], default=None)


def baseline_cost(tiers: Sequence[Mapping[str, Any]], prompt_tokens: int,
                  completion_tokens: int, at: datetime | float | None = None) -> Decimal:
    """What the same tokens would have cost on the frontier tier (at its price in force
    at ``at``) with no engine prefix reuse and no cache: what savings are measured
    against."""
    top = baseline_tier(tiers)
    if top is None:
        return Decimal(0)
    return tier_cost(top, at, prompt_tokens, 0, completion_tokens)


def book_cost(tiers: Sequence[Mapping[str, Any]], served: Mapping[str, Any] | None,
              at: datetime | float | None, prompt_tokens: int, cached_tokens: int,
              completion_tokens: int, baseline_completion_tokens: int | None = None
              ) -> tuple[Decimal, Decimal]:
    """(cost, frontier baseline) the ledger books for a request finished at ``at`` on
    tier ``served`` (None: nothing was generated, e.g. a cache hit, which costs 0).

    For a self-hosted pool tier the cost is its per-token price: a real-time estimate
    that the GPU-hour allocation replaces in the FinOps rollups
    (``app.finops.rollups.allocate_gpu_hours``). ``baseline_completion_tokens``: the
    output the frontier would have generated (before key minification); default the
    completion tokens."""
    cost = tier_cost(served, at, prompt_tokens, cached_tokens, completion_tokens) \
        if served else Decimal(0)
    out = completion_tokens if baseline_completion_tokens is None else baseline_completion_tokens
    return cost, baseline_cost(tiers, prompt_tokens, out, at)


# --- savings per stage ------------------------------------------------------------------

# The ledger's per-stage columns (``saved_<stage>_usd``), in pipeline order.
STAGES = ("cache", "routing", "minify", "prefix", "escalation")
# A discarded attempt's reason -> the stage that paid for it (anything else: escalation).
_ATTEMPT_STAGE = {"schema_retry": "minify", "low_margin": "escalation"}


def stage_savings(tiers: Sequence[Mapping[str, Any]], served: Mapping[str, Any] | None,
                  at: datetime | float | None, prompt_tokens: int, cached_tokens: int,
                  completion_tokens: int, baseline_completion_tokens: int | None = None,
                  attempts: Iterable[Mapping[str, Any]] = (), *, cache_hit: bool = False
                  ) -> dict[str, Decimal]:
    """What each pipeline stage saved on one request against the all-frontier baseline,
    as ``book_cost`` books it (same tiers, instant and tokens), in ``STAGES`` order; each
    stage is measured with the stages before it on (a waterfall), so the parts add up to
    ``baseline - cost`` exactly:

    - cache: a hit saved the whole baseline (it generated nothing);
    - routing: the baseline minus the served tier's price for the same tokens (the
      client's own output size, no prefix reuse): the tier choice, routed or named;
    - minify: the output tokens key minification saved, at the served tier's output
      price, less any schema retry it caused;
    - prefix: the prompt tokens the engine reused, at the served tier's input price
      less its cached-input price;
    - escalation: minus what the discarded low-margin attempts cost (a cost, <= 0).

    ``attempts``: the discarded attempts the booked cost includes (``cost_usd``, ``reason``).
    Amounts are ledger-rounded (``costing.to_ledger``) and sum exactly to
    ``to_ledger(baseline) - to_ledger(cost)``: any rounding residue goes to the largest
    part."""
    from app.core.costing import to_ledger
    prompt = max(int(prompt_tokens or 0), 0)
    cached = min(max(int(cached_tokens or 0), 0), prompt)
    out = max(int(completion_tokens or 0), 0)
    raw = out if baseline_completion_tokens is None else max(int(baseline_completion_tokens), 0)
    baseline = baseline_cost(tiers, prompt, raw, at)
    parts = {s: Decimal(0) for s in STAGES}
    spent = Decimal(0)
    for a in attempts:
        c = _price({"c": a.get("cost_usd")}, "c")
        parts[_ATTEMPT_STAGE.get(str(a.get("reason")), "escalation")] -= c
        spent += c
    if served is not None and not cache_hit:
        at_raw = tier_cost(served, at, prompt, 0, raw)
        at_out = tier_cost(served, at, prompt, 0, out)
        served_cost = tier_cost(served, at, prompt, cached, out)
        parts["routing"] += baseline - at_raw
        parts["minify"] += at_raw - at_out
        parts["prefix"] += at_out - served_cost
        spent += served_cost
    elif cache_hit:
        parts["cache"] += baseline
    else:  # nothing generated (a failure): its tokens' baseline was never spent on any tier
        parts["routing"] += baseline
    rounded = {s: to_ledger(v) for s, v in parts.items()}
    residue = (to_ledger(baseline) - to_ledger(spent)) - sum(rounded.values(), Decimal(0))
    if residue:
        largest = max(STAGES, key=lambda s: (abs(parts[s]), -STAGES.index(s)))
        rounded[largest] += residue
    return rounded
