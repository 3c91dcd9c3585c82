"""Auth, policy and limits as the gateway sees them through the snapshot."""
from __future__ import annotations

from datetime import timedelta

import httpx
import openai
import pytest

from app.extensions import db
from app.models_base import utcnow
from app.policies.models import Policy
from tests.gateway.conftest import make_world, publish_and_wait

MSGS = [{"role": "user", "content": "admission"}]


def test_rate_limit_is_429_rate_limit_error(app, gateway, fake_replicas, frontier):
    w = make_world(app, gateway, [fake_replicas[0].url], frontier.url,
                   policy={"rate_limit_rpm": 2})
    client = w.client()
    client.chat.completions.create(model="tier-1", messages=MSGS)
    client.chat.completions.create(model="tier-1", messages=MSGS)
    with pytest.raises(openai.RateLimitError) as exc:
        client.chat.completions.create(model="tier-1", messages=MSGS)
    assert exc.value.body["code"] == "rate_limit_exceeded"
    assert int(exc.value.response.headers["retry-after"]) <= 60


def test_tier_not_allowed_is_403_and_models_follow_policy(app, gateway, fake_replicas, frontier):
    w = make_world(app, gateway, [fake_replicas[0].url], frontier.url,
                   policy={"allowed_tiers": ["tier-1", "tier-2"]})
    client = w.client()
    assert [m.id for m in client.models.list()] == ["auto", "tier-1", "tier-2"]
    with pytest.raises(openai.PermissionDeniedError) as exc:
        client.chat.completions.create(model="tier-3", messages=MSGS)
    assert exc.value.body["code"] == "tier_not_allowed" and exc.value.body["param"] == "model"
    # auto's frontier-first rule stays inside what the tenant may use
    raw = client.chat.completions.with_raw_response.create(model="auto", messages=MSGS)
    assert raw.headers["x-sluice-tier"] == "tier-2"


def test_snapshot_reload_without_restart(world):
    client = world.client()
    client.chat.completions.create(model="tier-3", messages=MSGS)
    db.session.add(Policy(tenant_id=world.tenant.id, values={"allowed_tiers": ["tier-1"]}))
    db.session.commit()
    publish_and_wait(world.gateway)
    assert [m.id for m in client.models.list()] == ["auto", "tier-1"]
    with pytest.raises(openai.PermissionDeniedError):
        client.chat.completions.create(model="tier-3", messages=MSGS)


def test_suspended_tenant_expired_and_revoked_keys(world):
    from tests.factories import make_key
    client = world.client()
    expired, expired_plain = make_key(world.tenant, name="old")
    expired.expires_at = utcnow() - timedelta(minutes=1)
    revoked, revoked_plain = make_key(world.tenant, name="gone")
    db.session.commit()
    publish_and_wait(world.gateway)
    with pytest.raises(openai.AuthenticationError) as exc:
        world.client(api_key=expired_plain).chat.completions.create(model="tier-1", messages=MSGS)
    assert exc.value.body["code"] == "expired_api_key"
    world.client(api_key=revoked_plain).chat.completions.create(model="tier-1", messages=MSGS)
    revoked.revoked_at = utcnow()
    world.tenant.status = "suspended"
    db.session.commit()
    publish_and_wait(world.gateway)
    with pytest.raises(openai.AuthenticationError):
        world.client(api_key=revoked_plain).chat.completions.create(model="tier-1", messages=MSGS)
    with pytest.raises(openai.PermissionDeniedError) as exc:
        client.chat.completions.create(model="tier-1", messages=MSGS)
    assert exc.value.body["code"] == "tenant_suspended"
    r = httpx.post(world.base_url + "/chat/completions", json={"model": "tier-1",
                                                              "messages": MSGS})
    assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key"


def test_metrics_and_health(world):
    world.client().chat.completions.create(model="tier-1", messages=MSGS)
    text = httpx.get(world.gateway.url + "/metrics").text
    assert 'sluice_gateway_requests_total{cache="miss",status="200",tier="tier-1"}' in text
    assert "sluice_gateway_ttft_seconds_bucket" in text
    assert 'sluice_gateway_tokens_total{kind="out",tier="tier-1"}' in text
    h = httpx.get(world.gateway.url + "/healthz").json()
    assert h["ok"] and h["redis"] and h["snapshot_version"] >= 1


def test_racing_publishes_never_bring_a_revoked_key_back(world):
    """A build that read the database before a revocation and finishes after the build
    that read it after: the older one is not stored, and the gateway refuses the key."""
    from app.snapshot import service as snapshots
    from tests.factories import make_key
    key, plain = make_key(world.tenant, name="racing")
    db.session.commit()
    publish_and_wait(world.gateway)
    world.client(api_key=plain).chat.completions.create(model="tier-1", messages=MSGS)
    slow_version = snapshots.next_version()          # build A: its version, then its read
    stale = snapshots.build_snapshot()               # ... sees the key
    key.revoked_at = utcnow()
    db.session.commit()
    fresh = snapshots.publish()                      # build B: reads after the revocation
    assert fresh > slow_version
    assert snapshots.store(slow_version, stale) == fresh   # A lands last: not stored
    from app.redis_client import get_redis, keys
    import json
    stored = json.loads(get_redis().get(keys().snapshot_data()))
    assert stored["version"] == fresh and key.key_hash not in stored["keys"]
    publish_and_wait(world.gateway)
    with pytest.raises(openai.AuthenticationError):
        world.client(api_key=plain).chat.completions.create(model="tier-1", messages=MSGS)
    print(f"\n[fault] racing publishes around a revocation: stale build v{slow_version} "
          f"not stored, stored v{stored['version']}, revoked key refused=True", flush=True)
