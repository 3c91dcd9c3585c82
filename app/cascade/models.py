"""Versioned cascade-router models (per tenant/workflow, or global)."""
from __future__ import annotations

from sqlalchemy import JSON, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.models_base import UTCDateTime, utcnow

ROUTER_STATES = ("candidate", "active", "retired", "rejected")


class RouterModel(db.Model):
    __tablename__ = "router_models"
    __table_args__ = (UniqueConstraint("scope", "version", name="uq_router_models_scope_version"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    # "global", "tenant:<id>" or "tenant:<id>:wf:<signature>"
    scope: Mapped[str] = mapped_column(String(120), index=True)
    version: Mapped[int] = mapped_column()
    status: Mapped[str] = mapped_column(String(16), default="candidate")
    created_at = mapped_column(UTCDateTime, default=utcnow)
    trained_on: Mapped[int] = mapped_column(default=0)
    # Exported weights (per tier: coef, intercept, calibration map) run with numpy at request time.
    params: Mapped[dict] = mapped_column(JSON, default=dict)
    # Held-out evaluation: ECE before/after calibration, AUC, cost-quality curve, comparison.
    metrics: Mapped[dict] = mapped_column(JSON, default=dict)
