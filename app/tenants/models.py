"""Tenants (departments or customers) and their gateway API keys."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column, relationship

from app.extensions import db
from app.models_base import UTCDateTime, utcnow

TENANT_STATUSES = ("active", "suspended")


class Tenant(db.Model):
    __tablename__ = "tenants"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    department: Mapped[str] = mapped_column(String(100), default="")
    status: Mapped[str] = mapped_column(String(16), default="active")
    created_at = mapped_column(UTCDateTime, default=utcnow)

    keys = relationship("ApiKey", back_populates="tenant", order_by="ApiKey.id")

    def to_dict(self) -> dict:
        return {"id": self.id, "name": self.name, "department": self.department,
                "status": self.status, "created_at": self.created_at.isoformat()}


class ApiKey(db.Model):
    """A gateway key. Only its SHA-256 hash is stored; the prefix is shown for recognition."""

    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    prefix: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at = mapped_column(UTCDateTime, default=utcnow)
    expires_at = mapped_column(UTCDateTime, nullable=True)
    revoked_at = mapped_column(UTCDateTime, nullable=True)

    tenant = relationship("Tenant", back_populates="keys")

    def is_usable(self, now: datetime) -> bool:
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > now)

    def to_dict(self) -> dict:
        return {"id": self.id, "tenant_id": self.tenant_id, "name": self.name,
                "prefix": self.prefix, "created_at": self.created_at.isoformat(),
                "expires_at": self.expires_at.isoformat() if self.expires_at else None,
                "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None}
