"""Security finding 6: a tenant cannot learn whether another tenant's prompt prefix is in
the engines' prefix cache: requests carry a per-tenant cache_salt by default."""
from __future__ import annotations

from tests.gateway.conftest import make_world, publish_and_wait

SYSTEM = "You are the secret-project assistant of Acme's merger team, codename Bluebird."


def _cached(world, key: str) -> int:
    r = world.client(api_key=key).chat.completions.create(model="tier-1", messages=[
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": "hello"}])
    return r.usage.prompt_tokens_details.cached_tokens


def _two_tenants(app, gateway, replica, frontier, policy=None):
    """One replica (both tenants reach the same engine cache); tenant a's and b's keys."""
    from app.extensions import db
    from app.policies.models import Policy
    from tests.factories import TenantFactory, make_key
    world = make_world(app, gateway, [replica.url], frontier.url, policy=policy)
    other = TenantFactory()
    if policy:
        db.session.add(Policy(tenant_id=other.id, values=policy))
        db.session.commit()
    _, other_key = make_key(other)
    publish_and_wait(gateway)
    return world, world.key, other_key


def test_another_tenants_prefix_shows_as_not_cached(app, gateway, fake_replicas, frontier):
    world, a, b = _two_tenants(app, gateway, fake_replicas[0], frontier)
    assert _cached(world, a) == 0
    assert _cached(world, a) > 0          # a's own prefix is reused
    assert _cached(world, b) == 0         # b learns nothing about a's prompt
    assert _cached(world, b) > 0


def test_a_policy_may_share_a_public_prefix(app, gateway, fake_replicas, frontier):
    world, a, b = _two_tenants(app, gateway, fake_replicas[1], frontier,
                               policy={"cache_salt": False})
    assert _cached(world, a) == 0 and _cached(world, b) > 0
