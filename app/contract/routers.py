"""The gateway side of router publishing: which scopes' active routers it holds, compiled.

The control plane writes ``<ns>:router:<scope>:active`` (JSON: scope, version, model_id,
params, taus: the version's own τ {"1": τ1, "2": τ2} or null) and bumps ``<ns>:router:version`` (app.cascade.service.publish_active). A gateway
keeps one ``PublishedRouters``, calls ``refresh(redis, ns)`` on its snapshot poll (one GET
when nothing changed), and at S01 asks ``get(tenant_id, workflow)``: the workflow's
router, else the tenant's, else the global one, else None (S01_DEFAULT_TIER2; with
``own_only``, what policy frontier_until_router asks, the workflow's router alone);
``taus(tenant_id, workflow)`` gives that router's own τ (None: the policy's apply).
A malformed published entry is dropped (so that scope falls back), never raised.
"""
from __future__ import annotations

import json
import logging
from typing import Any

from app.contract.keys import Keys
from app.core import router_model as rm

log = logging.getLogger(__name__)


def scopes_for(tenant_id: int | str, workflow: str | None, *,
               own_only: bool = False) -> list[str]:
    """Lookup order for a request, most specific first. ``own_only``: a request of a
    workflow looks at that workflow's router alone (policy frontier_until_router)."""
    out = [f"tenant:{tenant_id}:wf:{workflow}"] if workflow else []
    if own_only and workflow:
        return out
    return out + [f"tenant:{tenant_id}", "global"]


class PublishedRouters:
    def __init__(self) -> None:
        self.version: int | None = None
        self._routers: dict[str, tuple[int, rm.Router]] = {}
        self._taus: dict[str, dict[int, float]] = {}   # scope -> the version's own τ

    def update(self, scope: str, raw: bytes | str | None) -> None:
        """Install (or, for None, remove) the published entry of one scope."""
        self._taus.pop(scope, None)
        if raw is None:
            self._routers.pop(scope, None)
            return
        try:
            entry = json.loads(raw)
            taus = {int(k): float(v) for k, v in (entry.get("taus") or {}).items()}
            self._routers[scope] = (int(entry["version"]), rm.load(entry["params"]))
            if taus:
                self._taus[scope] = taus
        except Exception as exc:  # noqa: BLE001 - a bad entry degrades to S01_DEFAULT_TIER2
            log.warning("router for %s not loaded: %s", scope, exc)
            self._routers.pop(scope, None)

    def get(self, tenant_id: int | str, workflow: str | None, *,
            own_only: bool = False) -> rm.Router | None:
        for scope in scopes_for(tenant_id, workflow, own_only=own_only):
            hit = self._routers.get(scope)
            if hit is not None:
                return hit[1]
        return None

    def taus(self, tenant_id: int | str, workflow: str | None, *,
             own_only: bool = False) -> dict[int, float] | None:
        """The τ published with the router ``get`` returns, None when it has none."""
        for scope in scopes_for(tenant_id, workflow, own_only=own_only):
            if scope in self._routers:
                return self._taus.get(scope)
        return None

    def versions(self) -> dict[str, int]:
        return {s: v for s, (v, _) in self._routers.items()}

    def refresh(self, redis: Any, namespace: str) -> bool:
        """Reload every scope when ``<ns>:router:version`` changed; True if it did.
        Keeps the routers it has when Redis is unreachable."""
        try:
            keys = Keys(namespace)
            raw = redis.get(keys.routers_version())
            version = int(raw) if raw is not None else 0
            if version == self.version:
                return False
            prefix, suffix = keys.router_active("\0").split("\0")
            found = {}
            for key in redis.scan_iter(match=f"{prefix}*{suffix}", count=500):
                k = key.decode() if isinstance(key, bytes) else key
                found[k[len(prefix):-len(suffix)]] = redis.get(k)
        except Exception as exc:  # noqa: BLE001 - keep serving the last routers
            log.warning("router refresh failed: %s", exc)
            return False
        for scope in set(self._routers) - set(found):
            self._routers.pop(scope, None)
            self._taus.pop(scope, None)
        for scope, raw in found.items():
            self.update(scope, raw)
        self.version = version
        return True
