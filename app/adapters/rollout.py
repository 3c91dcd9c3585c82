"""Approval and rollout: the side effects around the transitions.

- ``approve`` (an approver other than the requester): canary at the first step
  (``states.CANARY_STEPS``), and the adapter is hot-loaded on every replica of its pool
  (``pools.load_lora`` on the pool's node; per-replica results land in ``loaded``, a
  replica that failed is reported and gets no adapter traffic).
- ``advance``: the next canary step; at 100% the adapter is ``promoted`` and the one it
  replaces (if any) is superseded and unloaded.
- ``rollback``: one click from canary or promoted; the adapter is unloaded and the one
  before it (if it had been superseded) serves again, hot-loaded anew.

The canary share is consistent per session / static prefix (the gateway hashes the
request's routing key), so a client's prefix cache stays warm while the share grows.
"""
from __future__ import annotations

from app.adapters import service, states
from app.adapters.models import Adapter
from app.errors import ValidationError
from app.extensions import db
from app.snapshot.service import publish_after_commit


def _send_lora(adapter: Adapter, action: str) -> None:
    """Queue the hot-(un)load on every replica of the adapter's pool (its node's queue)."""
    from app.catalog.models import Pool
    from app.pools.service import send_to_node
    pool = db.session.get(Pool, adapter.pool_id) if adapter.pool_id else None
    if pool is not None:
        send_to_node(f"adapters.{action}", [adapter.id], pool.node)


def serving_for(tenant_id: int, workflow: str, *, exclude: int | None = None) -> Adapter | None:
    """The workflow's promoted adapter (the one a canary shares traffic with)."""
    q = db.select(Adapter).where(Adapter.tenant_id == tenant_id, Adapter.workflow == workflow,
                                 Adapter.state == states.PROMOTED)
    if exclude is not None:
        q = q.where(Adapter.id != exclude)
    return db.session.scalars(q.order_by(Adapter.id.desc())).first()


# Decisions that must say why.
_COMMENT_NEEDED = {"approve": "an approval needs a comment",
                   "reject": "a rejection needs a comment"}


def _checked(user, adapter_id: int, event: str, comment: str) -> Adapter:
    """The adapter, once the table and ``user`` allow ``event`` on it (and a comment is
    given where one is needed): checked before anything about it changes."""
    adapter = service.get_adapter(user, adapter_id)
    service.authorize(user, adapter, event)
    if event in _COMMENT_NEEDED and not comment.strip():
        raise ValidationError("say why", {"comment": [_COMMENT_NEEDED[event]]})
    return adapter


def shadow(user, adapter_id: int, comment: str = "") -> Adapter:
    """Candidate -> shadow, and the hot-load on its pool's node (whose ``load_adapter``
    publishes the snapshot that lets gateways shadow it)."""
    adapter = service.get_adapter(user, adapter_id)
    service.transition(user, adapter, "shadow", comment)
    _send_lora(adapter, "load")
    return adapter


def retire(user, adapter_id: int, comment: str = "") -> Adapter:
    """Retire an adapter nobody serves; one in shadow is also unloaded, and the snapshot
    published at once so gateways stop shadowing it."""
    adapter = service.get_adapter(user, adapter_id)
    was = adapter.state
    service.transition(user, adapter, "retire", comment)
    if was == states.SHADOW:
        _send_lora(adapter, "unload")
        publish_after_commit()
    return adapter


def approve(user, adapter_id: int, comment: str = "") -> Adapter:
    adapter = _checked(user, adapter_id, "approve", comment)
    current = serving_for(adapter.tenant_id, adapter.workflow, exclude=adapter.id)
    adapter.previous_adapter_id = current.id if current else None
    adapter.canary_pct = states.CANARY_STEPS[0]
    service.transition(user, adapter, "approve", comment,
                       data={"canary_pct": adapter.canary_pct})
    _send_lora(adapter, "load")
    return adapter


def reject(user, adapter_id: int, comment: str = "") -> Adapter:
    adapter = _checked(user, adapter_id, "reject", comment)
    return service.transition(user, adapter, "reject", comment)


def advance(user, adapter_id: int, comment: str = "") -> Adapter:
    """The next canary step; the last one promotes."""
    adapter = _checked(user, adapter_id, "advance", comment)
    steps = [s for s in states.CANARY_STEPS if s > adapter.canary_pct]
    if adapter.state != states.CANARY or steps[:1] == [100] or not steps:
        return promote(user, adapter_id, comment)
    adapter.canary_pct = steps[0]
    return service.transition(user, adapter, "advance", comment,
                              data={"canary_pct": adapter.canary_pct})


def promote(user, adapter_id: int, comment: str = "") -> Adapter:
    adapter = _checked(user, adapter_id, "promote", comment)
    previous = serving_for(adapter.tenant_id, adapter.workflow, exclude=adapter.id)
    adapter.canary_pct = 100
    service.transition(user, adapter, "promote", comment, data={"canary_pct": 100},
                       commit=previous is None)
    if previous is not None:
        service.transition(service.SYSTEM, previous, "supersede",
                           f"replaced by adapter {adapter.id}")
        _send_lora(previous, "unload")
    return adapter


def rollback(user, adapter_id: int, comment: str = "") -> Adapter:
    adapter = _checked(user, adapter_id, "rollback", comment)
    previous = db.session.get(Adapter, adapter.previous_adapter_id) \
        if adapter.previous_adapter_id else None
    was = adapter.state
    adapter.canary_pct = 0
    restore = previous is not None and previous.state == states.RETIRED \
        and was == states.PROMOTED
    service.transition(user, adapter, "rollback", comment, commit=not restore)
    _send_lora(adapter, "unload")
    if restore:
        previous.canary_pct = 100
        service.transition(service.SYSTEM, previous, "restore",
                           f"adapter {adapter.id} rolled back")
        _send_lora(previous, "load")
    return adapter
