import numpy as np

from app.core import router_model as rm
from app.redis_client import keys
from app.cascade import service
from app.contract.routers import PublishedRouters, scopes_for
from tests.factories import TenantFactory
from tests.cascade.helpers import accept_regret, traces


def test_gateway_side_picks_up_promotions_without_restart(app, redis_client):
    t = TenantFactory()
    accept_regret(t)
    routers = PublishedRouters()
    ns = keys().ns
    routers.refresh(redis_client, ns)
    assert routers.get(t.id, "wf1") is None  # nothing published: S01_DEFAULT_TIER2
    assert rm.route(routers.get(t.id, "wf1"), np.zeros(4), {1: 0.8, 2: 0.7}) == (2, {})

    model = service.train_scope(f"tenant:{t.id}", traces(800, seed=7))
    assert routers.refresh(redis_client, ns) is True
    assert routers.refresh(redis_client, ns) is False  # unchanged version: one GET
    r = routers.get(t.id, "wf1")
    assert r is not None and routers.versions()[f"tenant:{t.id}"] == model.version
    easy, hard = np.array([-2.0, 0, 0, 0]), np.array([3.0, 0, 0, 0])
    assert rm.route(r, easy, {1: 0.8, 2: 0.7})[0] == 1
    assert rm.route(r, hard, {1: 0.8, 2: 0.7})[0] == 3

    # a corrupted entry degrades that scope to the fallback instead of failing
    redis_client.set(service.active_key(f"tenant:{t.id}"), b"{not json")
    redis_client.incr(keys().routers_version())
    routers.refresh(redis_client, ns)
    assert routers.get(t.id, "wf1") is None


def test_scope_lookup_order():
    assert scopes_for(3, "abc") == ["tenant:3:wf:abc", "tenant:3", "global"]
    assert scopes_for(3, None) == ["tenant:3", "global"]
