"""Recording drill runs, and starting the long drills from the console as Celery tasks.

The drills themselves live with their areas, each the same way:

- CD-28A ``cache-poisoning`` in ``app.cache``, ``flask drill cache-poisoning``
- CD-28B ``domain-shift`` in ``app.cascade``, ``flask drill domain-shift``
- CD-28C ``replica-loss`` in ``app.replica_routing``, ``flask drill replica-loss``

Each area has:

- ``app/<area>/drill.py``: the drill itself, without Flask or SQL (handed what it needs):
  ``run_<drill>(...) -> dict`` (the report) and ``drill_passed(report, ...) -> bool``.
- ``app/<area>/drill_runs.py``: the recorded run, ``KIND`` and
  ``record_<drill>(..., actor=None) -> DrillRun``: validate (ValidationError or PairError,
  nothing recorded), ``start_run`` here, call ``run_<drill>``, ``finish_run`` here
  (passed / failed / error), return the finished run. A drill that must be recorded
  before it is queued elsewhere also has the two halves of ``record_<drill>``:
  ``start_<drill>`` (validate, record a ``running`` run) and ``execute_<drill>(run_id,
  ...)`` (drive it, finish the run); CD-28C does, as the console records it before
  queueing it on the pool's node.
- ``app/<area>/cli.py``: ``flask drill <kind>`` on ``app.drills.cli.drill_cli``, calling
  ``record_<drill>``.

This module has ``start_run`` / ``finish_run`` / ``list_runs`` and, for the drills that the
console and the admin API (``app.drills.views``) hand to a worker, ``queue_<drill>`` (the
request's side) and ``run_queued_<drill>`` (what the Celery task ``drills.<drill>`` in
``workers/tasks/drills.py`` calls; it ends in ``record_<drill>`` or ``execute_<drill>``).
CD-28A is quick: the views call ``record_cache_poisoning`` in the request.

A drill that calls the gateway needs a tenant API key. It never goes into the task's
message (brokers and worker logs keep those): the console puts it in Redis for
``SECRET_TTL_S`` under a random reference, and the task takes it out once."""
from __future__ import annotations

import secrets
from typing import Any

from flask import current_app

from app.drills.models import DRILL_KINDS, DrillRun
from app.errors import Forbidden, ValidationError
from app.extensions import db
from app.models_base import utcnow

SECRET_TTL_S = 600


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


def _secret_key(ref: str) -> str:
    from app.redis_client import keys
    return keys().drill_secret(ref)


def stash_secret(value: str) -> str:
    from app.redis_client import get_redis
    ref = secrets.token_urlsafe(16)
    get_redis().set(_secret_key(ref), value, ex=SECRET_TTL_S)
    return ref


def take_secret(ref: str) -> str | None:
    from app.redis_client import get_redis
    raw = get_redis().getdel(_secret_key(ref))
    return raw.decode() if isinstance(raw, bytes) else raw


def require_drill_run(actor) -> None:
    """Drills run as global ops/admin users; ``None`` is the system (the CLI)."""
    if actor is not None and not actor.can("drill.run"):
        raise Forbidden("your role may not run drills")


def _send(task: str, args: list, queue: str = "default") -> None:
    current_app.extensions["celery"].send_task(task, args=args, queue=queue)


def queue_replica_loss(actor, key: str, **params: Any) -> DrillRun:
    """Record a CD-28C run (``running``, progress "queued") and queue it on the pool's node
    queue, where the pool driver can stop the replicas' processes. Raises
    ValidationError (nothing recorded or queued) on bad parameters or a missing key."""
    from app.audit.service import record
    from app.pools.service import node_queue
    from app.replica_routing.drill_runs import start_replica_loss
    require_drill_run(actor)
    if not key:
        raise ValidationError("invalid replica-loss drill",
                              {"key": ["a tenant API key is required"]})
    run = start_replica_loss(actor=actor, **params)
    run.result = {"progress": "queued"}
    record(actor, "drill.start", "drill_run", run.id, after={"kind": run.kind, **run.params})
    db.session.commit()
    _send("drills.replica_loss", [run.id, stash_secret(key)], node_queue(run.params["node"]))
    return run


def queue_domain_shift(actor, key: str, **params: Any) -> None:
    """Queue CD-28B (``app.cascade.drill_runs.record_domain_shift``); the run appears when a
    worker starts it."""
    from app.audit.service import record
    require_drill_run(actor)
    if not key:
        raise ValidationError("invalid domain-shift drill",
                              {"key": ["a tenant API key is required"]})
    record(actor, "drill.start", "drill_run", "", after={"kind": "domain-shift", **params})
    db.session.commit()
    _send("drills.domain_shift", [params, stash_secret(key), getattr(actor, "id", None)])


def run_queued_replica_loss(run_id: int, ref: str) -> DrillRun:
    from app.replica_routing.drill_runs import execute_replica_loss
    key = take_secret(ref)
    run = db.session.get(DrillRun, run_id)
    if key is None:
        return finish_run(run, {}, passed=None, error="the drill's API key expired before "
                                                     "a worker took it; start it again")
    return execute_replica_loss(run_id, key)


def run_queued_domain_shift(params: dict[str, Any], ref: str,
                            actor_id: int | None) -> DrillRun:
    from app.auth.models import User
    from app.cascade.drill_runs import KIND, record_domain_shift
    actor = db.session.get(User, actor_id) if actor_id is not None else None
    key = take_secret(ref)
    try:
        if key is None:
            raise ValidationError("the drill's API key expired before a worker took it",
                                  {"key": ["start the drill again"]})
        return record_domain_shift(key=key, actor=actor, **params)
    except ValidationError as exc:      # shown on the page as a run that never started
        run = start_run(KIND, params, actor)
        detail = "; ".join(f"{k}: {', '.join(v)}" for k, v in exc.errors.items())
        return finish_run(run, {}, passed=None, error=detail or exc.message)
