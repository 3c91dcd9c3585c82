"""Console users, their roles, and admin API tokens."""
from __future__ import annotations

from flask_login import UserMixin
from sqlalchemy import ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column, relationship

from app.extensions import db
from app.models_base import UTCDateTime, utcnow

ROLES = ("admin", "ops", "finops", "approver", "viewer")

# What each role may do. Reading is open to every signed-in role (scoped by tenant).
ROLE_PERMISSIONS: dict[str, frozenset[str]] = {
    "admin": frozenset({"tenant.manage", "key.manage", "catalog.manage", "pool.operate",
                        "policy.manage", "user.manage", "budget.manage", "adapter.approve",
                        "cache.invalidate", "drill.run", "workflow.manage", "audit.read",
                        "secret.manage", "engine.configure", "adapter.train",
                        "adapter.rollback"}),
    "ops": frozenset({"tenant.manage", "key.manage", "catalog.manage", "pool.operate",
                      "policy.manage", "cache.invalidate", "drill.run", "workflow.manage",
                      "adapter.train", "adapter.rollback"}),
    "finops": frozenset({"budget.manage"}),
    "approver": frozenset({"adapter.approve", "adapter.rollback"}),
    "viewer": frozenset(),
}

# Permissions that act on shared infrastructure: a tenant-scoped user never has them.
GLOBAL_ONLY = frozenset({"catalog.manage", "pool.operate", "user.manage", "drill.run",
                         "audit.read", "secret.manage", "engine.configure"})


class User(UserMixin, db.Model):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(255), unique=True)
    password_hash: Mapped[str] = mapped_column(String(255))
    role: Mapped[str] = mapped_column(String(16), default="viewer")
    tenant_id: Mapped[int | None] = mapped_column(ForeignKey("tenants.id", ondelete="SET NULL"))
    active: Mapped[bool] = mapped_column(default=True)
    created_at = mapped_column(UTCDateTime, default=utcnow)
    last_login_at = mapped_column(UTCDateTime, nullable=True)
    # Bumped by sign-out and password change: sessions signed with an older value end.
    session_epoch: Mapped[int] = mapped_column(default=0, server_default="0")

    tenant = relationship("Tenant", foreign_keys=[tenant_id])

    def get_id(self) -> str:  # Flask-Login: what the session cookie names
        return f"{self.id}.{self.session_epoch}"

    @property
    def is_active(self) -> bool:  # Flask-Login
        return self.active

    def can(self, permission: str, tenant_id: int | None = None) -> bool:
        """Whether this user may do ``permission`` (on ``tenant_id`` when given)."""
        if permission not in ROLE_PERMISSIONS.get(self.role, frozenset()):
            return False
        if self.tenant_id is not None:
            if permission in GLOBAL_ONLY:
                return False
            if tenant_id is None or tenant_id != self.tenant_id:
                return False
        return True

    def sees_tenant(self, tenant_id: int | None) -> bool:
        return self.tenant_id is None or self.tenant_id == tenant_id

    def to_dict(self) -> dict:
        return {"id": self.id, "email": self.email, "role": self.role,
                "tenant_id": self.tenant_id, "active": self.active}


class AdminToken(db.Model):
    """Bearer token for the JSON admin API; stored as a SHA-256 hash only."""

    __tablename__ = "admin_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(100))
    prefix: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at = mapped_column(UTCDateTime, default=utcnow)
    revoked_at = mapped_column(UTCDateTime, nullable=True)

    user = relationship("User")
