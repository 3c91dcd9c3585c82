"""Workflows (the seed's task signatures): created by traffic, named by people."""
from __future__ import annotations

from sqlalchemy import ForeignKey, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from app.extensions import db
from app.models_base import UTCDateTime, utcnow

COHORTS = ("structured_extraction", "support_rag", "code_sql", "complex_reasoning",
           "batch_summarization", "uncategorized")


class Workflow(db.Model):
    __tablename__ = "workflows"
    __table_args__ = (UniqueConstraint("tenant_id", "signature", name="uq_workflows_tenant_sig"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    signature: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(200), default="")
    category: Mapped[str] = mapped_column(String(32), default="uncategorized")
    first_seen_at = mapped_column(UTCDateTime, default=utcnow)

    tenant = relationship("Tenant")

    def to_dict(self) -> dict:
        return {"id": self.id, "tenant_id": self.tenant_id, "signature": self.signature,
                "name": self.name, "category": self.category,
                "first_seen_at": self.first_seen_at.isoformat()}
