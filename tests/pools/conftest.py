"""Pools fixtures: a real Celery worker consuming ``pool.local`` (threads, so the
supervisor runs beside a replica start), and a tiny model for reference replicas."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.celery_workers import start_worker
from tests.ports import free_port_run  # noqa: F401 - the pools tests import it from here


def free_port_pair() -> int:
    return free_port_run(2)


def tenant_on_pool(pool, frontier, gateway, **policy) -> str:
    """A tenant whose tier-1 is ``pool`` (tier-3 the external ``frontier``) behind the real
    gateway, with margin escalation, frontier-first and the cache off (plus ``policy``);
    publishes the snapshot and returns the tenant's API key."""
    from decimal import Decimal

    from app.catalog.models import Tier
    from app.extensions import db
    from app.policies.models import Policy
    from tests.factories import TenantFactory, make_key
    from tests.gateway.conftest import publish_and_wait
    tenant = TenantFactory()
    _, key = make_key(tenant)
    db.session.add(Tier(name="tier-1", rank=1, model="tiny", upstream_kind="pool",
                        pool_id=pool.id, price_input_per_m=Decimal("0.06"),
                        price_output_per_m=Decimal("0.18"), timeout_s=60))
    db.session.add(Tier(name="tier-3", rank=3, model="frontier-model", upstream_kind="external",
                        endpoint_url=frontier.url + "/v1", api_key_env="SLUICE_PROVIDER_KEY_FRONTIER",
                        price_input_per_m=Decimal("3.5"), price_output_per_m=Decimal("10.5")))
    db.session.add(Policy(tenant_id=None, values={}))
    db.session.add(Policy(tenant_id=tenant.id, values={
        "margin_gamma": 0.0, "frontier_first_hours": 0, "cache_enabled": False, **policy}))
    db.session.commit()
    publish_and_wait(gateway)
    return key


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from app.engine.model import build_tiny_llama
    return build_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama")


@pytest.fixture(scope="session")
def pool_worker(app_config, tmp_path_factory):
    with start_worker(app_config, tmp_path_factory.mktemp("poolworker"), queue="pool.local",
                      name="pools", pool_args=("--pool", "threads", "--concurrency", "4"),
                      extra_env={"SLUICE_NODE": "local"}) as worker:
        yield worker
