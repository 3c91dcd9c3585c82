"""Workflow operations: created by traffic (the ledger drain), named and categorised by people."""
from __future__ import annotations

from app.audit.service import record
from app.errors import Forbidden, NotFound, ValidationError
from app.extensions import db
from app.workflows.models import COHORTS, Workflow


def _insert_ignore(rows: list[dict]) -> int:
    """INSERT .. ON CONFLICT (tenant_id, signature) DO NOTHING on PostgreSQL and SQLite;
    returns how many were new."""
    if not rows:
        return 0
    dialect = db.session.get_bind().dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    elif dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    else:  # pragma: no cover - other backends: check then insert
        new = 0
        for row in rows:
            exists = db.session.scalar(db.select(Workflow.id).where(
                Workflow.tenant_id == row["tenant_id"], Workflow.signature == row["signature"]))
            if exists is None:
                db.session.add(Workflow(**row))
                new += 1
        db.session.flush()
        return new
    stmt = insert(Workflow).values(rows).on_conflict_do_nothing(
        index_elements=["tenant_id", "signature"]).returning(Workflow.id)
    return len(db.session.execute(stmt).all())


def ensure_workflows(pairs: set[tuple[int, str]], names: dict[tuple[int, str], str] | None = None
                     ) -> int:
    """Create the missing (tenant_id, signature) workflows in the current transaction;
    the caller commits. Safe against concurrent drains (the unique key decides).
    Returns how many were created."""
    from app.models_base import utcnow
    names = names or {}
    now = utcnow()
    rows = [{"tenant_id": t, "signature": s, "name": names.get((t, s), "")[:200],
             "category": "uncategorized", "first_seen_at": now}
            for t, s in sorted(pairs)]
    return _insert_ignore(rows)


OVERFLOW = "other"   # where a tenant's traffic beyond its workflow cap is counted


def admit_workflows(pairs: set[tuple[int, str]], names: dict[tuple[int, str], str],
                    cap: int) -> tuple[int, set[tuple[int, str]]]:
    """``ensure_workflows`` within a cap per tenant: a tenant that already has ``cap``
    workflows gets no new one (each would grow every gateway's snapshot: a client can
    invent X-Sluice-Workflow values at will); those pairs are returned, to be counted
    under OVERFLOW. Returns (created, refused)."""
    tenants = {t for t, _ in pairs}
    have = dict(db.session.execute(
        db.select(Workflow.tenant_id, db.func.count()).where(Workflow.tenant_id.in_(tenants))
        .group_by(Workflow.tenant_id)).all()) if tenants else {}
    known = {(t, sig) for t, sig in db.session.execute(
        db.select(Workflow.tenant_id, Workflow.signature).where(
            Workflow.tenant_id.in_(tenants)))} if tenants else set()
    admitted, refused = set(), set()
    for t, sig in sorted(pairs - known):
        if sig != OVERFLOW and have.get(t, 0) >= cap:
            refused.add((t, sig))
            continue
        admitted.add((t, sig))
        have[t] = have.get(t, 0) + 1
    admitted |= {(t, OVERFLOW) for t, _ in refused}
    return ensure_workflows(admitted, names), refused


def ensure_workflow(tenant_id: int, signature: str, name: str = "", *,
                    commit: bool = True) -> Workflow:
    """The workflow for (tenant, signature), created if new. Idempotent."""
    ensure_workflows({(tenant_id, signature)}, {(tenant_id, signature): name})
    wf = db.session.scalar(db.select(Workflow).where(Workflow.tenant_id == tenant_id,
                                                     Workflow.signature == signature))
    if commit:
        db.session.commit()
    return wf


def list_workflows(user, *, tenant_id: int | None = None) -> list[Workflow]:
    q = db.select(Workflow).order_by(Workflow.first_seen_at.desc(), Workflow.id.desc())
    if user.tenant_id is not None:
        q = q.where(Workflow.tenant_id == user.tenant_id)
    elif tenant_id is not None:
        q = q.where(Workflow.tenant_id == tenant_id)
    return list(db.session.scalars(q))


TOOL_TOKEN_DAYS = 7


def tool_token_totals(workflows: list[Workflow], days: int = TOOL_TOKEN_DAYS
                      ) -> dict[int, tuple[int, int, int]]:
    """Workflow id -> (tool-definition tokens sent, tokens tool retrieval kept out,
    full-set retries) over the last ``days`` days of the ledger (gateway rows)."""
    from datetime import timedelta

    import sqlalchemy as sa

    from app.ledger.models import LedgerEntry
    from app.models_base import utcnow
    if not workflows:
        return {}
    by_key = {(w.tenant_id, w.signature): w.id for w in workflows}
    q = (sa.select(LedgerEntry.tenant_id, LedgerEntry.workflow,
                   sa.func.sum(LedgerEntry.tool_tokens), sa.func.sum(LedgerEntry.tool_tokens_saved),
                   sa.func.sum(LedgerEntry.tool_retries))
         .where(LedgerEntry.tenant_id.in_({w.tenant_id for w in workflows}),
                LedgerEntry.at >= utcnow() - timedelta(days=days),
                LedgerEntry.kind == "request", LedgerEntry.tool_tokens > 0)
         .group_by(LedgerEntry.tenant_id, LedgerEntry.workflow))
    out = {}
    for tenant_id, signature, sent, saved, retries in db.session.execute(q):
        wid = by_key.get((tenant_id, signature))
        if wid is not None:
            out[wid] = (int(sent or 0), int(saved or 0), int(retries or 0))
    return out


def tool_memory_sizes(workflows: list[Workflow]) -> dict[int, int] | None:
    """Workflow id -> conversations tool retrieval remembers for it (the gateways' shared
    memory, ``app.gateway.workflow_memory``); None when Redis does not answer."""
    import redis

    from app.redis_client import get_redis, keys
    if not workflows:
        return {}
    k = keys()
    try:
        pipe = get_redis().pipeline(transaction=False)
        for w in workflows:
            pipe.xlen(k.tool_memory(w.tenant_id, w.signature))
        sizes = pipe.execute()
    except (redis.RedisError, OSError):
        return None
    return {w.id: int(n) for w, n in zip(workflows, sizes) if n}


def get_workflow(user, workflow_id: int) -> Workflow:
    wf = db.session.get(Workflow, workflow_id)
    if wf is None or not user.sees_tenant(wf.tenant_id):
        raise NotFound("no such workflow")
    return wf


def _clean(data: dict) -> dict:
    errors: dict[str, list[str]] = {}
    clean: dict = {}
    if "name" in data:
        name = str(data.get("name") or "").strip()
        if len(name) > 200:
            errors["name"] = ["must be at most 200 characters"]
        else:
            clean["name"] = name
    if "category" in data:
        cat = data.get("category")
        if cat not in COHORTS:
            errors["category"] = [f"must be one of {', '.join(COHORTS)}"]
        else:
            clean["category"] = cat
    unknown = set(data) - {"name", "category"}
    for field in sorted(unknown):
        errors[field] = ["cannot be changed"]
    if errors:
        raise ValidationError("invalid workflow", errors)
    return clean


def update_workflow(user, workflow_id: int, data: dict) -> Workflow:
    wf = get_workflow(user, workflow_id)
    if not user.can("workflow.manage", wf.tenant_id):
        raise Forbidden(f"your role ({user.role}) may not do this")
    clean = _clean(data)
    before = wf.to_dict()
    for key, value in clean.items():
        setattr(wf, key, value)
    record(user, "workflow.update", "workflow", wf.id, tenant_id=wf.tenant_id,
           before=before, after=wf.to_dict())
    db.session.commit()
    from app.snapshot.service import publish_after_commit
    publish_after_commit()
    return wf
