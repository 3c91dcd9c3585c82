"""Audit writing. Services call ``record`` inside their unit of work (they commit)."""
from __future__ import annotations

from typing import Any

from app.audit.models import AuditLog
from app.extensions import db

SECRET_FIELDS = {"key_hash", "password_hash", "token_hash", "password", "key", "token"}


def _scrub(d: dict[str, Any] | None) -> dict[str, Any] | None:
    if d is None:
        return None
    return {k: ("[redacted]" if k in SECRET_FIELDS else v) for k, v in d.items()}


class SystemActor:
    """The actor of changes the system makes itself (boot scripts, workers finishing a
    training, the CLI run by an operator on the host), audited as "system"."""

    id = None
    email = "system"
    role = "admin"
    tenant_id = None

    def can(self, permission: str, tenant_id: int | None = None) -> bool:
        return True

    def sees_tenant(self, tenant_id: int | None) -> bool:
        return True


SYSTEM = SystemActor()


def record(actor, action: str, entity_type: str, entity_id: Any = "", *,
           tenant_id: int | None = None, before: dict | None = None,
           after: dict | None = None) -> AuditLog:
    """Add an audit row to the current session; the caller's commit makes it durable."""
    row = AuditLog(actor_id=getattr(actor, "id", None),
                   actor_email=getattr(actor, "email", None) or "system",
                   action=action, entity_type=entity_type,
                   entity_id=str(entity_id or "")[:64],
                   tenant_id=tenant_id, before=_scrub(before), after=_scrub(after))
    db.session.add(row)
    return row


def list_entries(user, *, limit: int = 200, action: str | None = None) -> list[AuditLog]:
    q = db.select(AuditLog).order_by(AuditLog.id.desc()).limit(limit)
    if user.tenant_id is not None:
        q = q.where(AuditLog.tenant_id == user.tenant_id)
    if action:
        q = q.where(AuditLog.action == action)
    return list(db.session.scalars(q))
