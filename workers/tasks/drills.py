"""Drills started from the console. CD-28C runs on the pool's node queue ``pool.<node>``
(its replicas are stopped through the pool driver there); CD-28B on ``default``."""
from __future__ import annotations

from celery import shared_task


@shared_task(name="drills.replica_loss")
def replica_loss(run_id: int, secret_ref: str) -> str:
    from app.drills.service import run_queued_replica_loss
    return run_queued_replica_loss(run_id, secret_ref).status


@shared_task(name="drills.domain_shift")
def domain_shift(params: dict, secret_ref: str, actor_id: int | None = None) -> str:
    from app.drills.service import run_queued_domain_shift
    return run_queued_domain_shift(params, secret_ref, actor_id).status
