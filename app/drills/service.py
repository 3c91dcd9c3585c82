"""Recording drill runs. The drills themselves live with their areas (cache, routing, router)."""
from __future__ import annotations

from app.drills.models import DRILL_KINDS, DrillRun
from app.errors import ValidationError
from app.extensions import db
from app.models_base import utcnow


def start_run(kind: str, params: dict, actor=None) -> DrillRun:
    if kind not in DRILL_KINDS:
        raise ValidationError("unknown drill", {"kind": [f"must be one of {', '.join(DRILL_KINDS)}"]})
    run = DrillRun(kind=kind, params=params, actor_email=getattr(actor, "email", None) or "system")
    db.session.add(run)
    db.session.commit()
    return run


def finish_run(run: DrillRun, result: dict, *, passed: bool | None, error: str = "") -> DrillRun:
    run.result = {**result, **({"error": error} if error else {})}
    run.status = "error" if error else ("passed" if passed else "failed" if passed is False else "done")
    run.finished_at = utcnow()
    db.session.commit()
    return run


def list_runs(kind: str | None = None, limit: int = 50) -> list[DrillRun]:
    q = db.select(DrillRun).order_by(DrillRun.id.desc()).limit(limit)
    if kind:
        q = q.where(DrillRun.kind == kind)
    return list(db.session.scalars(q))
