"""Reading and changing policies (global default and per-tenant overrides)."""
from __future__ import annotations

from typing import Any

from app.audit.service import record
from app.catalog.models import Tier
from app.errors import Forbidden, ValidationError
from app.extensions import db
from app.contract import policy as schema
from app.policies.models import Policy
from app.snapshot.service import publish_after_commit
from app.tenants.service import get_tenant


def _row(tenant_id: int | None) -> Policy | None:
    return db.session.scalar(db.select(Policy).where(
        Policy.tenant_id.is_(None) if tenant_id is None else Policy.tenant_id == tenant_id))


def global_values() -> dict[str, Any]:
    row = _row(None)
    return dict(row.values) if row else {}


def tenant_values(tenant_id: int) -> dict[str, Any]:
    row = _row(tenant_id)
    return dict(row.values) if row else {}


def effective_policy(tenant_id: int | None) -> dict[str, Any]:
    return schema.effective(global_values(), tenant_values(tenant_id) if tenant_id else None)


def update_policy(user, tenant_id: int | None, values: dict[str, Any],
                  *, replace: bool = False) -> Policy:
    """Set fields of the global policy (tenant_id None) or a tenant's override.

    ``replace`` drops override fields not given (a tenant form that clears a field
    inherits the global value again). Empty-string values also mean "inherit".
    """
    if tenant_id is None:
        if user.tenant_id is not None or not user.can("policy.manage"):
            raise Forbidden("only global ops or admins may change the global policy")
    else:
        get_tenant(user, tenant_id)
        if not user.can("policy.manage", tenant_id):
            raise Forbidden(f"your role ({user.role}) may not change policies")
    cleared = {k for k, v in values.items() if v in ("", None) and tenant_id is not None}
    given = {k: v for k, v in values.items() if k not in cleared}
    base = global_values() if tenant_id is not None else {}
    current = _row(tenant_id)
    old = dict(current.values) if current else {}
    kept = {} if replace else {k: v for k, v in old.items() if k not in cleared}
    if user.tenant_id is not None:
        # a tenant-scoped user's form cannot send central fields: keep what was set there
        kept.update({k: v for k, v in old.items()
                     if k in schema.FIELDS and schema.FIELDS[k].tenant == schema.TENANT_CENTRAL
                     and k not in given})
    known = set(db.session.scalars(db.select(Tier.name)))
    clean, errors = schema.validate(given, base={**base, **kept}, known_tiers=known)
    if errors:
        raise ValidationError("invalid policy", errors)
    if user.tenant_id is not None:
        # only what they change is held to the central bounds (an override a global user
        # set beyond them stays, and the form may send it back unchanged)
        changed = {k: v for k, v in clean.items() if k not in old or old[k] != v}
        beyond = schema.beyond_bounds(changed, schema.effective(base, None))
        if beyond:
            raise Forbidden("a tenant may narrow its limits, never go past the central ones",
                            beyond)
    new_values = {**kept, **clean}
    if current is None:
        current = Policy(tenant_id=tenant_id, values=new_values)
        db.session.add(current)
    else:
        current.values = new_values
    db.session.flush()
    record(user, "policy.update", "policy", tenant_id if tenant_id else "global",
           tenant_id=tenant_id, before=old, after=new_values)
    db.session.commit()
    publish_after_commit()
    return current
