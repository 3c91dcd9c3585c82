"""Real processes for gateway tests: fake OpenAI upstreams and the gateway itself, each a
uvicorn subprocess on a port the OS picked; a catalog in SQL published as the snapshot."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from decimal import Decimal

import httpx
import pytest

from tests.servers import FRONTIER_KEY, ROOT, Server  # noqa: F401 (re-exported)


def wait_for(pred, timeout: float = 15.0, what: str = "condition"):
    """Poll ``pred`` (bounded); returns its first truthy value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        val = pred()
        if val:
            return val
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def health(gw: Server) -> dict:
    return httpx.get(gw.url + "/healthz", timeout=5).json()


def publish_and_wait(gw: Server) -> int:
    from app.snapshot.service import publish
    version = publish()
    wait_for(lambda: (health(gw).get("snapshot_version") or 0) >= version, what="snapshot reload")
    return version


@dataclass
class World:
    gateway: Server
    tenant: object
    key: str
    tiers: dict
    pool: object
    written_before: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return self.gateway.url + "/v1"

    def client(self, **kw):
        import openai
        return openai.OpenAI(base_url=self.base_url, api_key=kw.pop("api_key", self.key),
                             max_retries=0, timeout=kw.pop("timeout", 30), **kw)

    def wait_ledger(self, n: int) -> None:
        """Until the gateway has put ``n`` more events on the stream than at the start."""
        wait_for(lambda: health(self.gateway)["ledger_written"] >= self.written_before + n,
                 what=f"{n} ledger events")

    def drain_rows(self, n: int):
        from app.extensions import db
        from app.ledger.models import LedgerEntry
        from app.ledger.service import drain_stream
        self.wait_ledger(n)
        drain_stream(max_batches=50)
        db.session.expire_all()
        return list(db.session.scalars(db.select(LedgerEntry).where(
            LedgerEntry.tenant_id == self.tenant.id).order_by(LedgerEntry.id)))


def off_path_gateway(app_config, tmp_path_factory, name: str, **config) -> Server:
    """A gateway of its own with extra config (the session's shared one keeps off-path
    work such as exploration and cache verification off, so tests that count rows see none)."""
    import json
    cfg = {"REDIS_URL": app_config["REDIS_URL"], "REDIS_NAMESPACE": app_config["REDIS_NAMESPACE"],
           "GATEWAY_SNAPSHOT_POLL_S": 0.1, "GATEWAY_MAX_BODY_BYTES": 64 * 1024,
           "QDRANT_PATH": str(tmp_path_factory.mktemp(f"{name}-qdrant")),
           "GATEWAY_LEDGER_SPOOL_DIR": str(tmp_path_factory.mktemp(f"{name}-spool")), **config}
    return Server("gateway", json.dumps(cfg), env={"SLUICE_PROVIDER_KEY_FRONTIER": FRONTIER_KEY},
                  log_dir=tmp_path_factory.mktemp("logs"))


def make_world(app, gateway: Server, replica_urls: list[str], frontier_url: str,
               policy: dict | None = None, tier_timeout: float = 30.0,
               tier2_urls: list[str] | None = None) -> World:
    """Tiers 1 and 2 share one pool of ``replica_urls`` unless ``tier2_urls`` gives tier 2
    a pool of its own; tier 3 is the external ``frontier_url``."""
    from app.catalog.models import Pool, Replica, Tier
    from app.extensions import db
    from app.policies.models import Policy
    from tests.factories import TenantFactory, make_key

    tenant = TenantFactory()
    _, key = make_key(tenant)
    pool = Pool(name=f"pool-{tenant.id}", model="tiny", served_model_name="tiny-served",
                engine="reference", options={})
    db.session.add(pool)
    db.session.flush()
    for i, url in enumerate(replica_urls):
        db.session.add(Replica(pool_id=pool.id, index=i, url=url, state="healthy"))
    pools = {1: pool, 2: pool}
    if tier2_urls:
        pools[2] = Pool(name=f"pool-{tenant.id}-t2", model="tiny", served_model_name="tiny-t2",
                        engine="reference", options={})
        db.session.add(pools[2])
        db.session.flush()
        for i, url in enumerate(tier2_urls):
            db.session.add(Replica(pool_id=pools[2].id, index=i, url=url, state="healthy"))
    prices = {1: ("0.06", "0.015", "0.18"), 2: ("0.35", "0.0875", "1.05"),
              3: ("3.50", "0.875", "10.50")}
    tiers = {}
    for rank, (pin, pcached, pout) in prices.items():
        external = rank == 3
        t = Tier(name=f"tier-{rank}", rank=rank, model="frontier-model" if external else "tiny",
                 price_input_per_m=Decimal(pin), price_cached_input_per_m=Decimal(pcached),
                 price_output_per_m=Decimal(pout),
                 upstream_kind="external" if external else "pool",
                 pool_id=None if external else pools[rank].id,
                 endpoint_url=frontier_url + "/v1" if external else "",
                 api_key_env="SLUICE_PROVIDER_KEY_FRONTIER" if external else "",
                 timeout_s=tier_timeout)
        db.session.add(t)
        tiers[rank] = t
    db.session.add(Policy(tenant_id=None, values={}))
    if policy:
        db.session.add(Policy(tenant_id=tenant.id, values=policy))
    db.session.commit()
    written = health(gateway)["ledger_written"]
    publish_and_wait(gateway)
    return World(gateway=gateway, tenant=tenant, key=key, tiers=tiers, pool=pool,
                 written_before=written)


@pytest.fixture()
def world(app, gateway, fake_replicas, frontier):
    return make_world(app, gateway, [s.url for s in fake_replicas], frontier.url)
