"""The cost ledger: one append-only row per gateway request (corrections are new rows)."""
from __future__ import annotations

from decimal import Decimal

import sqlalchemy as sa
from sqlalchemy import JSON, BigInteger, Index, Numeric, String
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.models_base import UTCDateTime, utcnow

Money = Numeric(18, 10)
# The per-stage savings columns, in app.core.pricing.STAGES order.
SAVED_COLUMNS = ("saved_cache_usd", "saved_routing_usd", "saved_minify_usd",
                 "saved_prefix_usd", "saved_escalation_usd")
# Rows of calls the gateway made off the response path: nobody's request, never on a budget,
# a rollup or a FinOps total (FinOps shows their cost on its own line, ``off_path_usage``).
# shadow: an adapter in shadow or tier-1 exploration (app.gateway.shadow); cache_verify: a
# sampled cache hit generated again to check it (app.gateway.cache_verify).
OFF_PATH_KINDS = ("shadow", "cache_verify")


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
    # request | adjustment | shadow | cache_verify (the last two: OFF_PATH_KINDS, never on
    # a budget or a FinOps total)
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
    # Savings per pipeline stage against the frontier baseline (app.core.pricing.
    # stage_savings; STAGES order); they add up to baseline_cost_usd - cost_usd on a
    # gateway row (0 on adjustments, off-path runs and rows booked before migration 0013).
    saved_cache_usd: Mapped[Decimal] = mapped_column(Money, default=0, server_default="0")
    saved_routing_usd: Mapped[Decimal] = mapped_column(Money, default=0, server_default="0")
    saved_minify_usd: Mapped[Decimal] = mapped_column(Money, default=0, server_default="0")
    saved_prefix_usd: Mapped[Decimal] = mapped_column(Money, default=0, server_default="0")
    # <= 0: what the discarded low-margin attempts cost (a margin escalation is a cost)
    saved_escalation_usd: Mapped[Decimal] = mapped_column(Money, default=0, server_default="0")
    # Tool traffic (migration 0014): tokens of the tool definitions sent upstream, those
    # tool retrieval kept out, and 1 when a call to an unsent tool made it resend them all
    tool_tokens: Mapped[int] = mapped_column(default=0, server_default="0")
    tool_tokens_saved: Mapped[int] = mapped_column(default=0, server_default="0")
    tool_retries: Mapped[int] = mapped_column(default=0, server_default="0")
    # The full seed-6.2-shaped telemetry record.
    payload: Mapped[dict] = mapped_column(JSON, default=dict)
