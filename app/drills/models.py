"""History of chaos drills (cache poisoning, replica loss, domain shift)."""
from __future__ import annotations

from sqlalchemy import JSON, String
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.models_base import UTCDateTime, utcnow

DRILL_KINDS = ("cache-poisoning", "replica-loss", "domain-shift", "prefix-routing-sim")


class DrillRun(db.Model):
    __tablename__ = "drill_runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(32), index=True)
    status: Mapped[str] = mapped_column(String(16), default="running")  # running|passed|failed|error
    started_at = mapped_column(UTCDateTime, default=utcnow)
    finished_at = mapped_column(UTCDateTime, nullable=True)
    actor_email: Mapped[str] = mapped_column(String(255), default="system")
    params: Mapped[dict] = mapped_column(JSON, default=dict)
    result: Mapped[dict] = mapped_column(JSON, default=dict)

    def to_dict(self) -> dict:
        return {"id": self.id, "kind": self.kind, "status": self.status,
                "started_at": self.started_at.isoformat(),
                "finished_at": self.finished_at.isoformat() if self.finished_at else None,
                "actor_email": self.actor_email, "params": self.params, "result": self.result}
