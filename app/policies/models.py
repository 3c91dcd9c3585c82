"""Policies: one global row (tenant_id NULL) plus optional per-tenant overrides."""
from __future__ import annotations

from sqlalchemy import JSON, ForeignKey
from sqlalchemy.orm import Mapped, mapped_column, relationship

from app.extensions import db
from app.models_base import UTCDateTime, utcnow


class Policy(db.Model):
    __tablename__ = "policies"

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int | None] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), unique=True, nullable=True)
    # Only the fields this row sets; see app.contract.policy for names and defaults.
    values: Mapped[dict] = mapped_column(JSON, default=dict)
    updated_at = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)

    tenant = relationship("Tenant")
