"""The cost ledger: one append-only row per gateway request (corrections are new rows)."""
from __future__ import annotations

from decimal import Decimal

import sqlalchemy as sa
from sqlalchemy import JSON, BigInteger, Index, Numeric, String
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.models_base import UTCDateTime, utcnow

Money = Numeric(18, 10)


class LedgerEntry(db.Model):
    __tablename__ = "ledger_entries"
    __table_args__ = (Index("ix_ledger_tenant_at", "tenant_id", "at"),
                      # the few counted rows, found without scanning the ledger
                      Index("ix_ledger_counted_at", "at",
                            postgresql_where=sa.text("usage_source = 'counted'"),
                            sqlite_where=sa.text("usage_source = 'counted'")),
                      # shadow verdicts per adapter (app.adapters.serving.shadow_rollup)
                      Index("ix_ledger_shadow_adapter", "adapter",
                            postgresql_where=sa.text("kind = 'shadow'"),
                            sqlite_where=sa.text("kind = 'shadow'")))

    id: Mapped[int] = mapped_column(BigInteger().with_variant(db.Integer, "sqlite"),
                                    primary_key=True)
    request_id: Mapped[str] = mapped_column(String(64), unique=True)
    # request | adjustment | shadow (an adapter's off-path run: never on a budget or a
    # FinOps total, app.gateway.shadow)
    kind: Mapped[str] = mapped_column(String(16), default="request")
    at = mapped_column(UTCDateTime, default=utcnow)
    tenant_id: Mapped[int] = mapped_column(index=True)
    workflow: Mapped[str] = mapped_column(String(64), default="")
    tier: Mapped[str] = mapped_column(String(64), default="")
    model: Mapped[str] = mapped_column(String(200), default="")
    status: Mapped[int] = mapped_column(default=200)
    cache: Mapped[str] = mapped_column(String(16), default="miss")  # miss|exact|semantic
    prompt_tokens: Mapped[int] = mapped_column(default=0)
    cached_tokens: Mapped[int] = mapped_column(default=0)
    completion_tokens: Mapped[int] = mapped_column(default=0)
    cost_usd: Mapped[Decimal] = mapped_column(Money, default=0)
    baseline_cost_usd: Mapped[Decimal] = mapped_column(Money, default=0)
    escalated: Mapped[bool] = mapped_column(default=False)
    ttft_ms: Mapped[float | None] = mapped_column(nullable=True)
    latency_ms: Mapped[float | None] = mapped_column(nullable=True)
    # "upstream": tokens as the engine reported them; "counted": the stream ended before
    # the engine's usage, so the gateway counted what it relayed (app.gateway.usage)
    usage_source: Mapped[str] = mapped_column(String(16), default="upstream",
                                              server_default="upstream")
    # The LoRA adapter that generated the answer ("" for the base model)
    adapter: Mapped[str] = mapped_column(String(64), default="", server_default="")
    # The full seed-6.2-shaped telemetry record.
    payload: Mapped[dict] = mapped_column(JSON, default=dict)
