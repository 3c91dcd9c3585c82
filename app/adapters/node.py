"""The node's side of a rollout (tasks ``adapters.load`` / ``adapters.unload`` on the
pool's node queue): hot-(un)load an adapter on every serving replica of its pool and
write what each engine answered into ``adapter.loaded`` ({replica id: "ok" | the
error}). The gateway serves the adapter only on replicas marked "ok" (the snapshot's
``replicas_loaded``), so a replica that failed is reported on the adapter and gets no
adapter traffic. One commit, then the snapshot is published.

A replica that (re)starts holds no adapter: ``restore_on_replica`` loads its pool's
adapters (shadow, canary, promoted) on it before the driver marks it healthy, so the
gateway never sends adapter traffic to an engine that lost the adapter."""
from __future__ import annotations

import logging

from app.adapters import states
from app.adapters.models import Adapter
from app.extensions import db
from app.snapshot.service import publish_after_commit

log = logging.getLogger(__name__)


def _result_text(result: dict) -> str:
    if result.get("ok"):
        return "ok"
    detail = (result.get("detail") or "").strip()
    status = result.get("status")
    return (f"HTTP {status}: {detail}" if status else detail or "failed")[:300]


def load_adapter(adapter_id: int) -> dict[str, str]:
    """Load ``adapter_id`` on its pool; returns {replica id: "ok" | error}."""
    from workers.pools import driver
    adapter = db.session.get(Adapter, adapter_id)
    if adapter is None or adapter.pool_id is None or not adapter.artifact_path:
        log.warning("adapter %s: nothing to load (no adapter, pool or artifact)", adapter_id)
        return {}
    results = driver.load_lora(adapter.pool_id, adapter.name, adapter.artifact_path)
    loaded = {str(rid): _result_text(r) for rid, r in results.items()}
    adapter.loaded = loaded
    failed = {rid: text for rid, text in loaded.items() if text != "ok"}
    adapter.error = ("load failed on replica " + ", ".join(
        f"{rid}: {text}" for rid, text in sorted(failed.items())))[:2000] if failed else ""
    if failed:
        log.warning("adapter %s (%s): load failed on %s", adapter.id, adapter.name, failed)
    db.session.commit()
    publish_after_commit()
    return loaded


def unload_adapter(adapter_id: int) -> dict[str, str]:
    """Unload ``adapter_id`` from its pool; replicas that unloaded leave ``loaded``, a
    replica that failed keeps an "unload failed" note (not "ok": it is never routed)."""
    from workers.pools import driver
    adapter = db.session.get(Adapter, adapter_id)
    if adapter is None or adapter.pool_id is None:
        return {}
    results = driver.unload_lora(adapter.pool_id, adapter.name)
    out = {str(rid): _result_text(r) for rid, r in results.items()}
    loaded = {rid: text for rid, text in (adapter.loaded or {}).items() if rid not in out}
    loaded.update({rid: f"unload failed: {text}" for rid, text in out.items() if text != "ok"})
    adapter.loaded = loaded
    db.session.commit()
    publish_after_commit()
    return out


def restore_on_replica(pool_id: int, replica_id: int, url: str) -> dict[str, str]:
    """Load every adapter the pool should hold on a replica that just (re)started, and
    write each result into that adapter's ``loaded``; returns {adapter name: "ok" | error}.
    No commit: the driver commits it with the replica's move to healthy."""
    from app.contract.secrets import pool_engine_key
    from workers.pools import lora
    out: dict[str, str] = {}
    key = pool_engine_key(pool_id)
    for a in db.session.scalars(db.select(Adapter).where(
            Adapter.pool_id == pool_id, Adapter.artifact_path.is_not(None),
            Adapter.state.in_(states.HELD)).order_by(Adapter.id)):
        result = lora.load_everywhere([(replica_id, url)], a.name, a.artifact_path,
                                      api_key=key)[replica_id]
        text = _result_text(result)
        a.loaded = {**(a.loaded or {}), str(replica_id): text}
        out[a.name] = text
        if text != "ok":
            a.error = f"load failed on replica {replica_id} after its restart: {text}"[:2000]
            log.warning("adapter %s (%s): reload on replica %s failed: %s", a.id, a.name,
                        replica_id, text)
    return out
