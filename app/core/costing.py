"""The FinOps money rules on plain data: GPU-hour rates and their allocation, cache-hit
savings, and the rounding rules. Token prices (effective-dated schedules, request cost,
the frontier baseline) live in ``app.core.pricing``, the one price model the gateway, the
simulator and the reports share.

Rounding rules (one place, so every report agrees):

- Per-request amounts are exact Decimals kept at 10 decimals (``to_ledger``), which is
  what ``ledger_entries.cost_usd`` (Numeric(18, 10)) stores. Sums in SQL are exact.
- Amounts are shown to the micro-dollar (``SHOWN``, the unit the budget counters count
  in): an LLM request costs fractions of a cent, so a cent would show most of them as
  $0.00. ``shown`` rounds an exact sum half-up; a breakdown shown next to a total uses
  ``allocate`` (largest remainder), so the shown lines add up to the shown total exactly;
  ``format_usd`` writes an amount the one way page, message and report all use (cents
  always, up to six decimals, no trailing zeros past the cents: $0.0044, $12.50). The
  page, the API and the CSV carry the same shown amounts. ``cents`` remains for what is
  settled in cents (an invoice line).
- Budgets count integer micro-dollars in Redis (``to_micro``: reservations round up,
  actual spend rounds half-up).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_CEILING, ROUND_FLOOR, ROUND_HALF_UP, Decimal
from typing import Any, Hashable, Mapping, Sequence, TypeVar

LEDGER_QUANTUM = Decimal("1e-10")
CENT = Decimal("0.01")
SHOWN = Decimal("0.000001")     # a micro-dollar: the precision every amount is shown with
MICRO = Decimal(1_000_000)
K = TypeVar("K", bound=Hashable)


def _dec(value: Any) -> Decimal:
    if isinstance(value, Decimal):
        return value
    return Decimal(str(value or 0))


def to_ledger(amount: Decimal) -> Decimal:
    """Half-up to the ledger's 10 decimals (``ledger_entries.cost_usd``)."""
    return amount.quantize(LEDGER_QUANTUM, rounding=ROUND_HALF_UP)


def cents(amount: Decimal) -> Decimal:
    return _dec(amount).quantize(CENT, rounding=ROUND_HALF_UP)


def shown(amount: Any) -> Decimal:
    """Half-up to the micro-dollar: the amount as every page and report shows it."""
    return _dec(amount).quantize(SHOWN, rounding=ROUND_HALF_UP)


def format_usd(amount: Any, *, grouped: bool = True, symbol: bool = True) -> str:
    """``$1,234.50``, ``$0.0044``, ``-$0.000012``: ``shown`` with at least the cents and
    no trailing zeros past them; "—" for None. ``symbol=False, grouped=False`` is the
    same figure as a plain number (``1234.50``) for CSV and webhooks."""
    if amount is None:
        return "—" if symbol else ""
    value = shown(amount)
    if symbol and value == 0 and _dec(amount) != 0:
        return "<$0.000001" if _dec(amount) > 0 else "-<$0.000001"
    sign = "-" if value < 0 else ""
    text = f"{abs(value):,.6f}" if grouped else f"{abs(value):.6f}"
    whole, _, frac = text.partition(".")
    frac = frac.rstrip("0").ljust(2, "0")
    return f"{sign}{'$' if symbol else ''}{whole}.{frac}"


def allocate(amounts: Sequence[Decimal], quantum: Decimal = SHOWN) -> list[Decimal]:
    """Round each amount to ``quantum`` so the rounded parts sum exactly to the rounded
    sum (largest remainder; ties go to the earlier item)."""
    exact = [_dec(a) for a in amounts]
    if not exact:
        return []
    total = _dec(sum(exact, Decimal(0))).quantize(quantum, rounding=ROUND_HALF_UP)
    floors = [(a / quantum).to_integral_value(rounding=ROUND_FLOOR) * quantum for a in exact]
    short = int(((total - sum(floors, Decimal(0))) / quantum).to_integral_value())
    order = sorted(range(len(exact)), key=lambda i: (-(exact[i] - floors[i]), i))
    out = list(floors)
    if short >= 0:
        for i in order[:short]:
            out[i] += quantum
    else:  # only with negative amounts (credits): take back from the smallest remainders
        for i in order[::-1][:-short]:
            out[i] -= quantum
    return [o.quantize(quantum) for o in out]


def allocate_cents(amounts: Sequence[Decimal]) -> list[Decimal]:
    """``allocate`` to the cent (parts sum exactly to ``cents(sum)``)."""
    return allocate(amounts, CENT)


def to_micro(amount_usd: Decimal | float | int | str, *, round_up: bool = False) -> int:
    """Integer micro-dollars for the Redis budget counters."""
    value = _dec(amount_usd) * MICRO
    return int(value.to_integral_value(rounding=ROUND_CEILING if round_up else ROUND_HALF_UP))


def from_micro(micro: int) -> Decimal:
    return Decimal(int(micro)) / MICRO


# --- GPU-hours for self-hosted pools ------------------------------------------------

@dataclass(frozen=True)
class GpuRate:
    gpu_type: str
    hourly_usd: Decimal
    effective_from: datetime | None = None


def gpu_rate_at(rates: Sequence[GpuRate], gpu_type: str, at: datetime) -> Decimal | None:
    """The hourly rate for ``gpu_type`` in force at ``at``; None when none applies yet."""
    best: GpuRate | None = None
    for rate in rates:
        if rate.gpu_type != gpu_type:
            continue
        if rate.effective_from is not None and rate.effective_from > at:
            continue
        if best is None or (rate.effective_from or datetime.min.replace(tzinfo=at.tzinfo)) >= \
                (best.effective_from or datetime.min.replace(tzinfo=at.tzinfo)):
            best = rate
    return None if best is None else best.hourly_usd


def pool_hour_cost(replicas: int, gpus_per_replica: int, hourly_usd: Decimal) -> Decimal:
    return Decimal(max(replicas, 0) * max(gpus_per_replica, 0)) * _dec(hourly_usd)


def allocate_by_tokens(hour_cost: Decimal, tokens: Mapping[K, int]) -> dict[K, Decimal]:
    """Split one pool-hour's cost over that hour's request groups by their share of the
    pool's tokens. Parts are at ledger precision and sum exactly to ``hour_cost`` (the
    rounding remainder goes to the largest group). Groups with no tokens (cache hits)
    get 0. With no tokens at all nothing is allocated: the hour is idle capacity."""
    total = sum(max(t, 0) for t in tokens.values())
    if total == 0 or hour_cost == 0:
        return {k: Decimal(0) for k in tokens}
    cost = to_ledger(_dec(hour_cost))
    out = {k: to_ledger(cost * max(t, 0) / total) for k, t in tokens.items()}
    largest = max(tokens, key=lambda k: tokens[k])
    out[largest] += cost - sum(out.values(), Decimal(0))
    return out


def cache_hit_saving(baseline_usd: Decimal) -> Decimal:
    """A cache hit costs nothing (no tokens, no GPU time); it saved its frontier baseline."""
    return _dec(baseline_usd)
