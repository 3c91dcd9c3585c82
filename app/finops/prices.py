"""Effective-dated prices: tier price changes (per 1M tokens) and GPU hourly rates.

A tier's price in force at an instant is the last ``TierPrice`` with ``effective_from``
at or before it (the Tier row's own prices before the first). The gateway books every
request at the price in force when it finishes, from the schedule in its config snapshot
(``snapshot_schedules``). GPU rates price self-hosted pool hours when the rollups
allocate them (``app.finops.rollups.allocate_gpu_hours``).

Booked costs are never re-priced, so a change can only be dated in the future: a tier
price at least ``LEAD_S`` ahead (every gateway reloads its snapshot before it applies),
a GPU rate from now on (a rebuild of past rollups must give the same numbers). The
console and the admin API both call ``add_tier_price`` / ``add_gpu_rate``; each writes
an audit row.
"""
from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from decimal import Decimal, InvalidOperation
from typing import Any

import sqlalchemy as sa

from app.audit.service import record
from app.catalog.models import Pool, Tier
from app.core import costing, pricing
from app.errors import Conflict, Forbidden, NotFound, ValidationError
from app.extensions import db
from app.models_base import row_id
from app.finops.models import GpuRate, TierPrice

LEAD_S = 60
_PRICE_FIELDS = ("price_input_per_m", "price_cached_input_per_m", "price_output_per_m")
_GPU_TYPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,31}$")


def _check_user(user) -> None:
    # Prices are shared by every tenant: only global FinOps admins (and admins) set them.
    if not user.can("budget.manage"):
        raise Forbidden("only global FinOps admins set prices")


def _money(errors: dict, field: str, raw: Any) -> Decimal | None:
    try:
        value = Decimal(str(raw).strip().replace(",", "").lstrip("$"))
    except (InvalidOperation, AttributeError):
        errors[field] = ["not a number"]
        return None
    if not value.is_finite() or value < 0:
        errors[field] = ["must be a number, 0 or more"]
        return None
    if value >= Decimal(10) ** 9:
        errors[field] = ["too large"]
        return None
    return value


def parse_when(raw: Any) -> datetime:
    """An ISO date or date-time; naive values are UTC. Raises ValueError."""
    if isinstance(raw, datetime):
        value = raw
    else:
        text = str(raw or "").strip().replace(" ", "T")
        if not text:
            raise ValueError("empty")
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def _effective(errors: dict, raw: Any, earliest: datetime, why: str) -> datetime | None:
    try:
        value = parse_when(raw).astimezone(timezone.utc)
    except (TypeError, ValueError):
        errors["effective_from"] = ["a date and time, e.g. 2027-01-01T00:00Z"]
        return None
    if value < earliest:
        errors["effective_from"] = [why]
        return None
    return value


# --- tier prices -------------------------------------------------------------------------

def add_tier_price(user, tier_id: Any, data: dict, *, now: datetime | None = None) -> TierPrice:
    """Schedule a tier's new per-1M prices from ``data["effective_from"]`` on."""
    _check_user(user)
    rid = row_id(tier_id)
    tier = db.session.get(Tier, rid) if rid is not None else None
    if tier is None:
        raise NotFound("no such tier", {"tier_id": ["unknown tier"]})
    now = now or datetime.now(timezone.utc)
    errors: dict[str, list[str]] = {}
    when = _effective(errors, data.get("effective_from"), now + timedelta(seconds=LEAD_S),
                      f"must be at least {LEAD_S} s in the future: booked costs are never "
                      "re-priced")
    prices = {f: _money(errors, f, data.get(f, "")) for f in _PRICE_FIELDS}
    if errors:
        raise ValidationError("the price change is not valid", errors)
    exists = db.session.scalar(sa.select(TierPrice.id).where(
        TierPrice.tier_id == tier.id, TierPrice.effective_from == when))
    if exists is not None:
        raise Conflict("this tier already has a price from that instant",
                       {"effective_from": ["already scheduled"]})
    row = TierPrice(tier_id=tier.id, effective_from=when, **prices)
    db.session.add(row)
    db.session.flush()
    record(user, "tier_price.create", "tier_price", row.id, after=_tier_price_dict(row, tier))
    db.session.commit()
    from app.snapshot.service import publish_after_commit
    publish_after_commit()  # gateways hold the schedule before it applies
    return row


def _tier_price_dict(row: TierPrice, tier: Tier) -> dict[str, Any]:
    return {"tier": tier.name, "tier_id": tier.id,
            "effective_from": row.effective_from.isoformat(),
            **{f: str(getattr(row, f)) for f in _PRICE_FIELDS}}


def _changes_by_tier() -> dict[int, list[TierPrice]]:
    out: dict[int, list[TierPrice]] = {}
    for p in db.session.scalars(sa.select(TierPrice).order_by(TierPrice.effective_from)):
        out.setdefault(p.tier_id, []).append(p)
    return out


def snapshot_schedules() -> dict[int, list[dict[str, Any]]]:
    """tier id -> its price changes for the gateway snapshot (``app.core.pricing``'s
    ``price_schedule`` shape), sorted by instant."""
    return {tier_id: [{"from": p.effective_from.isoformat(),
                       "from_ts": p.effective_from.timestamp(),
                       **{f: str(getattr(p, f)) for f in _PRICE_FIELDS}} for p in rows]
            for tier_id, rows in _changes_by_tier().items()}


def price_schedules() -> dict[str, dict[str, Any]]:
    """tier name -> its ``app.core.pricing`` tier (name, rank, own prices and
    ``price_schedule``), what ``pricing.tier_cost`` / ``baseline_cost`` price with."""
    changes = _changes_by_tier()
    return {t.name: pricing.tier_with_schedule(
        {"name": t.name, "rank": t.rank, **{f: getattr(t, f) for f in _PRICE_FIELDS}},
        [{"effective_from": p.effective_from, **{f: getattr(p, f) for f in _PRICE_FIELDS}}
         for p in changes.get(t.id, [])])
        for t in db.session.scalars(sa.select(Tier))}


# --- GPU rates ---------------------------------------------------------------------------

def add_gpu_rate(user, data: dict, *, now: datetime | None = None) -> GpuRate:
    """Schedule a GPU type's hourly rate from ``data["effective_from"]`` on (default:
    now). Pool hours are priced at the rate in force at the hour's start."""
    _check_user(user)
    now = now or datetime.now(timezone.utc)
    errors: dict[str, list[str]] = {}
    gpu_type = str(data.get("gpu_type") or "").strip()
    if not _GPU_TYPE.match(gpu_type):
        errors["gpu_type"] = ["a GPU type name such as H100 or L40S"]
    hourly = _money(errors, "hourly_usd", data.get("hourly_usd", ""))
    raw_when = data.get("effective_from") or now
    when = _effective(errors, raw_when, now, "must not be in the past: pool hours already "
                      "rolled up are never re-priced")
    if errors:
        raise ValidationError("the GPU rate is not valid", errors)
    exists = db.session.scalar(sa.select(GpuRate.id).where(GpuRate.gpu_type == gpu_type,
                                                           GpuRate.effective_from == when))
    if exists is not None:
        raise Conflict("this GPU type already has a rate from that instant",
                       {"effective_from": ["already scheduled"]})
    row = GpuRate(gpu_type=gpu_type, hourly_usd=hourly, effective_from=when)
    db.session.add(row)
    db.session.flush()
    record(user, "gpu_rate.create", "gpu_rate", row.id,
           after={"gpu_type": gpu_type, "hourly_usd": str(hourly),
                  "effective_from": when.isoformat()})
    db.session.commit()
    return row


# --- reading -----------------------------------------------------------------------------

def price_book(now: datetime | None = None) -> dict[str, Any]:
    """Every tier with its price in force now and its schedule; every GPU type in use or
    rated, with its rate in force now and its schedule."""
    now = now or datetime.now(timezone.utc)
    changes = _changes_by_tier()
    tiers = []
    for t in db.session.scalars(sa.select(Tier).order_by(Tier.rank)):
        own = {f: getattr(t, f) for f in _PRICE_FIELDS}
        schedule = [{"effective_from": None, **own, "in_force": False}]
        for p in changes.get(t.id, []):
            schedule.append({"effective_from": p.effective_from,
                             **{f: getattr(p, f) for f in _PRICE_FIELDS}, "in_force": False})
        current = max((i for i, s in enumerate(schedule)
                       if s["effective_from"] is None or s["effective_from"] <= now))
        schedule[current]["in_force"] = True
        tiers.append({"id": t.id, "name": t.name, "rank": t.rank,
                      "upstream_kind": t.upstream_kind, "schedule": schedule,
                      "now": schedule[current]})
    rates = list(db.session.scalars(sa.select(GpuRate).order_by(GpuRate.gpu_type,
                                                                GpuRate.effective_from)))
    plain = [costing.GpuRate(r.gpu_type, r.hourly_usd, r.effective_from) for r in rates]
    pools: dict[str, list[str]] = {}
    for p in db.session.scalars(sa.select(Pool).where(Pool.gpu_type != "").order_by(Pool.name)):
        pools.setdefault(p.gpu_type, []).append(p.name)
    gpus = []
    for gpu_type in sorted(set(pools) | {r.gpu_type for r in rates}):
        gpus.append({"gpu_type": gpu_type, "pools": pools.get(gpu_type, []),
                     "now": costing.gpu_rate_at(plain, gpu_type, now),
                     "schedule": [{"effective_from": r.effective_from,
                                   "hourly_usd": r.hourly_usd} for r in rates
                                  if r.gpu_type == gpu_type]})
    return {"tiers": tiers, "gpus": gpus, "now": now}
