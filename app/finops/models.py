"""FinOps: prices with effective dates, GPU rates, budgets, alerts and ledger rollups."""
from __future__ import annotations

from decimal import Decimal

from sqlalchemy import Column, ForeignKey, Index, Integer, Numeric, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.finops.histogram import N_BUCKETS
from app.models_base import UTCDateTime, utcnow

Money = Numeric(18, 10)
BUDGET_ACTIONS = ("alert", "hard_stop")
GRAINS = ("hour", "day", "month")


class TierPrice(db.Model):
    """A tier's price from ``effective_from`` on (until the next row). The Tier row's own
    prices are the price before the first TierPrice."""

    __tablename__ = "tier_prices"
    __table_args__ = (UniqueConstraint("tier_id", "effective_from", name="uq_tier_prices_from"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    tier_id: Mapped[int] = mapped_column(ForeignKey("tiers.id", ondelete="CASCADE"), index=True)
    effective_from = mapped_column(UTCDateTime)
    price_input_per_m: Mapped[Decimal] = mapped_column(Numeric(18, 8))
    price_cached_input_per_m: Mapped[Decimal] = mapped_column(Numeric(18, 8))
    price_output_per_m: Mapped[Decimal] = mapped_column(Numeric(18, 8))
    created_at = mapped_column(UTCDateTime, default=utcnow)


class GpuRate(db.Model):
    __tablename__ = "gpu_rates"
    __table_args__ = (UniqueConstraint("gpu_type", "effective_from", name="uq_gpu_rates_from"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    gpu_type: Mapped[str] = mapped_column(String(32))
    hourly_usd: Mapped[Decimal] = mapped_column(Numeric(18, 6))
    effective_from = mapped_column(UTCDateTime)


class Budget(db.Model):
    __tablename__ = "budgets"

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"),
                                           unique=True)
    monthly_limit_usd: Mapped[Decimal] = mapped_column(Numeric(18, 6))
    action: Mapped[str] = mapped_column(String(16), default="alert")
    webhook_url: Mapped[str] = mapped_column(String(500), default="")
    updated_at = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class BudgetAlert(db.Model):
    __tablename__ = "budget_alerts"
    __table_args__ = (UniqueConstraint("tenant_id", "period", "threshold_pct",
                                       name="uq_budget_alerts_once"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(index=True)
    period: Mapped[str] = mapped_column(String(7))  # YYYY-MM
    threshold_pct: Mapped[int] = mapped_column()
    spent_usd: Mapped[Decimal] = mapped_column(Money)
    at = mapped_column(UTCDateTime, default=utcnow)
    webhook_status: Mapped[str] = mapped_column(String(64), default="")


class Rollup(db.Model):
    """Aggregates of ledger rows per grain bucket and dimensions; rebuilt idempotently."""

    __tablename__ = "ledger_rollups"
    __table_args__ = (
        UniqueConstraint("grain", "bucket_start", "tenant_id", "tier", "workflow", "model",
                         name="uq_rollups_dims"),
        Index("ix_rollups_grain_bucket", "grain", "bucket_start"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    grain: Mapped[str] = mapped_column(String(8))
    bucket_start = mapped_column(UTCDateTime)
    tenant_id: Mapped[int] = mapped_column()
    department: Mapped[str] = mapped_column(String(100), default="")
    tier: Mapped[str] = mapped_column(String(64), default="")
    workflow: Mapped[str] = mapped_column(String(64), default="")
    model: Mapped[str] = mapped_column(String(200), default="")
    requests: Mapped[int] = mapped_column(default=0)
    cache_exact: Mapped[int] = mapped_column(default=0)
    cache_semantic: Mapped[int] = mapped_column(default=0)
    escalations: Mapped[int] = mapped_column(default=0)
    prompt_tokens: Mapped[int] = mapped_column(default=0)
    cached_tokens: Mapped[int] = mapped_column(default=0)
    completion_tokens: Mapped[int] = mapped_column(default=0)
    raw_schema_output_tokens: Mapped[int] = mapped_column(default=0)
    cost_usd: Mapped[Decimal] = mapped_column(Money, default=0)
    gpu_cost_usd: Mapped[Decimal] = mapped_column(Money, default=0)
    baseline_cost_usd: Mapped[Decimal] = mapped_column(Money, default=0)
    ttft_ms_sum: Mapped[float] = mapped_column(default=0.0)
    ttft_count: Mapped[int] = mapped_column(default=0)
    # ttft_b00..ttft_b34: counts per app.finops.histogram.TTFT_BOUNDS bucket, so p50/p95
    # over any period come from the rollups (added below the class; plain integer columns
    # sum far faster than JSON arrays).
    # Frontier baseline of the cache hits in the group (they cost 0: this is what they saved).
    cache_saved_usd: Mapped[Decimal] = mapped_column(Money, default=0)
    # The part of cost_usd that came from adjustment rows (credits are negative).
    adjustment_usd: Mapped[Decimal] = mapped_column(Money, default=0)
    # The part of cost_usd that is a self-hosted pool's per-token estimate replaced by its
    # GPU-hour allocation (gpu_cost_usd): reports charge cost - pool_estimate + gpu_cost.
    pool_estimate_usd: Mapped[Decimal] = mapped_column(Money, default=0)
    # Savings per pipeline stage (the ledger's saved_<stage>_usd summed, request rows only;
    # app.core.pricing.stage_savings): migration 0013.
    saved_cache_usd: Mapped[Decimal] = mapped_column(Money, default=0, server_default="0")
    saved_routing_usd: Mapped[Decimal] = mapped_column(Money, default=0, server_default="0")
    saved_minify_usd: Mapped[Decimal] = mapped_column(Money, default=0, server_default="0")
    saved_prefix_usd: Mapped[Decimal] = mapped_column(Money, default=0, server_default="0")
    saved_escalation_usd: Mapped[Decimal] = mapped_column(Money, default=0, server_default="0")


TTFT_BUCKET_COLUMNS = tuple(f"ttft_b{i:02d}" for i in range(N_BUCKETS))  # migration 0004: 35
for _name in TTFT_BUCKET_COLUMNS:
    setattr(Rollup, _name, Column(_name, Integer, nullable=False, default=0, server_default="0"))


class AdjustmentRequest(db.Model):
    """A ledger adjustment above ``FINOPS_ADJUSTMENT_SECOND_PERSON_USD``: it waits here
    until a second central FinOps user (not the requester) approves it, which books it as
    the ledger row (``ledger_request_id``), or rejects it."""

    __tablename__ = "adjustment_requests"

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column()
    amount_usd: Mapped[Decimal] = mapped_column(Money)
    reason: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    requested_by_id: Mapped[int | None] = mapped_column(nullable=True)
    requested_by: Mapped[str] = mapped_column(String(255))
    requested_at = mapped_column(UTCDateTime, default=utcnow)
    decided_by: Mapped[str | None] = mapped_column(String(255), nullable=True)
    decided_at = mapped_column(UTCDateTime, nullable=True)
    decision_comment: Mapped[str] = mapped_column(Text, default="", server_default="")
    ledger_request_id: Mapped[str | None] = mapped_column(String(64), nullable=True)

    def to_dict(self) -> dict:
        return {"id": self.id, "tenant_id": self.tenant_id, "amount_usd": f"{self.amount_usd:f}",
                "reason": self.reason, "state": self.state, "requested_by": self.requested_by,
                "requested_at": self.requested_at.isoformat() if self.requested_at else None,
                "decided_by": self.decided_by,
                "decided_at": self.decided_at.isoformat() if self.decided_at else None,
                "decision_comment": self.decision_comment,
                "ledger_request_id": self.ledger_request_id}
