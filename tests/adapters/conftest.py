"""Adapters fixtures: adapter rows made directly in the state a test needs, signed-in
browsers and API tokens per role, and a tenant with enough traces to train on."""
from __future__ import annotations

import hashlib
import itertools
import json
import uuid
from decimal import Decimal
from pathlib import Path

import pytest

from app.adapters.models import Adapter, AdapterTrace, TrainingDataset
from app.extensions import db
from app.redis_client import keys
from tests.console.web import browser, login
from tests.factories import PoolFactory, TenantFactory, UserFactory

NODE = "adaptersnode"   # no test worker consumes its queue: hot-loads stay there to inspect
TRAIN_WORKFLOW = hashlib.sha256(b"invoices-extract").hexdigest()
_names = itertools.count(1)


@pytest.fixture()
def pool(app):
    return PoolFactory(node=NODE)


@pytest.fixture()
def make_adapter(app, pool):
    """An adapter row of ``tenant`` in ``state`` (requested by ``requester``, a User or None
    for the system), committed; keyword arguments set any other column."""
    def make(tenant, state: str = "awaiting_approval", requester=None, **columns) -> Adapter:
        n = next(_names)
        values = dict(tenant_id=tenant.id, workflow=columns.pop("workflow", f"wf{n:04d}"),
                      workflow_name=f"workflow {n}", pool_id=pool.id, name=f"lora-{n}",
                      base_model="smollm2-135m", state=state,
                      requested_by_id=requester.id if requester else None,
                      requested_by=requester.email if requester else "system")
        if state in ("canary", "promoted"):
            values["canary_pct"] = 100 if state == "promoted" else 5
        adapter = Adapter(**{**values, **columns})
        db.session.add(adapter)
        db.session.commit()
        return adapter
    return make


@pytest.fixture()
def sign_in(app):
    """A fresh browser signed in as a new user of ``role`` (scoped to ``tenant`` if given)."""
    def sign(role: str, tenant=None):
        user = UserFactory(role=role, tenant=tenant)
        web = browser(app)
        login(web, user.email)
        return web, user
    return sign


@pytest.fixture()
def api_as(app):
    """A test client and the bearer header of a token acting as ``user``."""
    from app.auth.service import create_admin_token

    def token_for(user):
        _, token = create_admin_token(user, "tests")
        return app.test_client(), {"Authorization": f"Bearer {token}"}
    return token_for


def reload(adapter_id: int) -> Adapter:
    db.session.expire_all()
    return db.session.get(Adapter, adapter_id)


def queued_lora(redis_client) -> list[tuple[str, str]]:
    """(task, args) of the hot-(un)loads queued on the test pool's node."""
    raw = redis_client.lrange(f"{keys().ns}:celery:pool.{NODE}", 0, -1)
    return [(m["headers"]["task"], m["headers"]["argsrepr"]) for m in map(json.loads, raw)]


@pytest.fixture()
def trainable(app, pool, monkeypatch):
    """A tenant whose workflow "invoices" has 40 traces (its policy needs 10), a tier-1 tier
    on the test pool, and a Celery whose sends are recorded instead of queued. Returns
    (tenant, sent) where ``sent`` lists (task name, args)."""
    from app.catalog.models import Tier
    from app.policies.models import Policy
    from app.workflows.models import Workflow
    tenant = TenantFactory()
    run = uuid.uuid4().hex[:8]   # this test's own dataset file (others may freeze at once)
    db.session.add_all([
        Tier(name=f"tier-1-{tenant.id}", rank=1, model="tiny", upstream_kind="pool",
             pool_id=pool.id, price_input_per_m=Decimal("0.06"),
             price_output_per_m=Decimal("0.06")),
        Policy(tenant_id=tenant.id, values={"distill_min_traces": 10}),
        Workflow(tenant_id=tenant.id, signature=TRAIN_WORKFLOW, name="Invoices")])
    db.session.add_all([AdapterTrace(
        request_id=f"req_inv_{run}_{i:03d}", tenant_id=tenant.id, workflow=TRAIN_WORKFLOW,
        tier="tier-3", answer=json.dumps({"invoice": i}),
        messages=[{"role": "user", "content": f"invoice {i}"}]) for i in range(40)])
    db.session.commit()
    sent: list[tuple[str, list]] = []
    monkeypatch.setattr(app.extensions["celery"], "send_task",
                        lambda name, args=None, **kw: sent.append((name, args)))
    yield tenant, sent
    db.session.rollback()
    for path in db.session.scalars(db.select(TrainingDataset.path).where(
            TrainingDataset.tenant_id == tenant.id)):
        Path(path).unlink(missing_ok=True)


@pytest.fixture()
def two_tenants(app):
    return TenantFactory(name="acme"), TenantFactory(name="globex")
