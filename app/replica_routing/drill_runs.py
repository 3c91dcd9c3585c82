"""Drill CD-28C (replica loss) as a recorded DrillRun, for the CLI and the console.

``record_replica_loss`` runs it start to finish (the CLI). It is two halves, because the
console records the run before it queues it: ``start_replica_loss`` checks the request and
records a run (status ``running``); ``execute_replica_loss`` drives
``app.replica_routing.drill.run_replica_loss`` and finishes the run. The console queues
``drills.replica_loss`` on the pool's node queue, so that the replicas are stopped where
their processes live. Replicas are taken away through the pool driver
(``workers.pools.driver.stop_replica``): the replica becomes ``stopped`` in SQL and in the
gateway snapshot before its process ends, so the supervisor does not bring it back in the
middle of the drill. Each stop writes an audit row naming the run. The tenant API key is
never stored.
"""
from __future__ import annotations

import time
from typing import Callable
from urllib.parse import urlparse

import httpx

from app.audit.service import record
from app.catalog.models import Pool, Replica
from app.drills.models import DrillRun
from app.drills.service import finish_run, start_run
from app.errors import ValidationError
from app.extensions import db
from app.replica_routing.drill import drill_passed, live_moves_allowed, run_replica_loss

KIND = "replica-loss"
MAX_SESSIONS = 64
MAX_TURNS = 20


def _pool(pool_id: int | None = None, pool_name: str | None = None) -> Pool | None:
    if pool_id is not None:
        return db.session.get(Pool, pool_id)
    return db.session.scalar(db.select(Pool).where(Pool.name == pool_name))


def healthy_replicas(pool: Pool) -> list[dict]:
    """``[{"id", "url"}]`` of the pool's healthy replicas, by index."""
    return [{"id": r.id, "url": r.url} for r in sorted(pool.replicas, key=lambda r: r.index)
            if r.state == "healthy" and r.url]


def start_replica_loss(url: str, *, pool_id: int | None = None, pool_name: str | None = None,
                       stop_count: int = 2, sessions: int = 8, turns_before: int = 3,
                       turns_after: int = 4, model: str = "auto", actor=None) -> DrillRun:
    """Validate and record a run in state ``running``. Raises ValidationError (nothing is
    recorded) on bad parameters or a pool that cannot lose ``stop_count`` replicas."""
    errors: dict[str, list[str]] = {}
    parsed = urlparse(url or "")
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        errors["url"] = ["must be the gateway's http(s) base URL"]
    pool = _pool(pool_id, pool_name)
    if pool is None:
        errors["pool"] = [f"no pool named {pool_name!r}" if pool_name else "no such pool"]
    elif not 1 <= stop_count < len(healthy_replicas(pool)):
        errors["stop"] = [f"pool {pool.name} has {len(healthy_replicas(pool))} healthy "
                          f"replicas; cannot stop {stop_count} and keep serving"]
    if not 1 <= sessions <= MAX_SESSIONS:
        errors["sessions"] = [f"must be between 1 and {MAX_SESSIONS}"]
    if not 1 <= turns_before <= MAX_TURNS or not 1 <= turns_after <= MAX_TURNS:
        errors["turns"] = [f"turns before and after must be between 1 and {MAX_TURNS}"]
    if errors:
        raise ValidationError("invalid replica-loss drill", errors)
    params = {"url": url, "pool_id": pool.id, "pool": pool.name, "node": pool.node,
              "stop": stop_count, "sessions": sessions, "turns_before": turns_before,
              "turns_after": turns_after, "model": model}
    return start_run(KIND, params, actor=actor)


def _actor(run: DrillRun):
    from app.auth.models import User
    return db.session.scalar(db.select(User).where(User.email == run.actor_email))


def stop_for_drill(run: DrillRun, chosen: list[dict], wait_s: float = 30.0) -> None:
    """Stop ``chosen`` replicas through the pool driver (audited), then wait (bounded)
    until none answers /health."""
    from workers.pools.driver import stop_replica
    actor = _actor(run)
    for r in chosen:
        replica = db.session.get(Replica, r["id"])
        record(actor, "replica.stop", "replica", r["id"],
               after={"state": replica.state if replica else None, "drill_run": run.id})
        db.session.commit()
        stop_replica(r["id"])
    deadline = time.monotonic() + wait_s
    with httpx.Client(timeout=2.0) as client:
        for r in chosen:
            while time.monotonic() < deadline:
                try:
                    client.get(r["url"].rstrip("/") + "/health")
                except httpx.HTTPError:
                    break
                time.sleep(0.2)


def _progress(run: DrillRun) -> Callable[[dict], None]:
    total = run.params["turns_before"] + run.params["turns_after"]

    def report(turn: dict) -> None:
        turns = [*(run.result or {}).get("turns", []), turn]
        run.result = {"progress": f"turn {turn['turn'] + 1} of {total}", "turns": turns}
        db.session.commit()
    return report


def execute_replica_loss(run_id: int, key: str, *, timeout_s: float = 120.0,
                         stop: Callable[[DrillRun, list[dict]], None] | None = None) -> DrillRun:
    """Drive the recorded run ``run_id`` with tenant key ``key`` and finish it: "passed"
    (no failed client request, only the dead replicas' sessions moved, none served by a
    dead replica), "failed", or "error" (``result["error"]`` says how)."""
    run = db.session.get(DrillRun, run_id)
    if run is None or run.kind != KIND:
        raise ValidationError("no such replica-loss run", {"run": [str(run_id)]})
    p = run.params
    stop = stop or stop_for_drill
    try:
        pool = _pool(p["pool_id"])
        reps = healthy_replicas(pool) if pool else []
        if len(reps) <= p["stop"]:
            raise RuntimeError(f"pool has {len(reps)} healthy replicas; cannot stop {p['stop']}")
        result = run_replica_loss(p["url"], key, reps, lambda chosen: stop(run, chosen),
                                  stop_count=p["stop"], sessions=p["sessions"],
                                  turns_before=p["turns_before"], turns_after=p["turns_after"],
                                  model=p["model"], timeout_s=timeout_s, progress=_progress(run))
        db.session.expire_all()
        result["replica_states"] = {str(r.id): r.state for r in pool.replicas}
        choice = _replica_choice(key)
        result["replica_choice"] = choice
        result["live_moves_allowed"] = live_moves_allowed(result, choice)
    except Exception as exc:  # noqa: BLE001 - the run records what went wrong
        db.session.rollback()
        return finish_run(run, {}, passed=None, error=f"{type(exc).__name__}: {exc}"[:500])
    return finish_run(run, result, passed=drill_passed(result, choice))


def _replica_choice(key: str) -> str | None:
    """The replica_choice policy in force for the tenant of gateway key ``key`` (what the
    drill's sessions were routed by), or None when the key is not known here."""
    from app.policies.service import effective_policy
    from app.security import token_hash
    from app.tenants.models import ApiKey
    row = db.session.scalar(db.select(ApiKey).where(ApiKey.key_hash == token_hash(key)))
    return effective_policy(row.tenant_id).get("replica_choice") if row else None


def record_replica_loss(url: str, key: str, *, pool_id: int | None = None,
                        pool_name: str | None = None, stop_count: int = 2, sessions: int = 8,
                        turns_before: int = 3, turns_after: int = 4, model: str = "auto",
                        timeout_s: float = 120.0, actor=None) -> DrillRun:
    """``start_replica_loss`` then ``execute_replica_loss``: the finished run. Raises
    ValidationError (nothing recorded) on bad parameters."""
    run = start_replica_loss(url, pool_id=pool_id, pool_name=pool_name, stop_count=stop_count,
                             sessions=sessions, turns_before=turns_before,
                             turns_after=turns_after, model=model, actor=actor)
    return execute_replica_loss(run.id, key, timeout_s=timeout_s)
