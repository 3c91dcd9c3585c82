"""Security finding 2, "secrets out": a non-admin who may edit tiers pointed an external
tier at a host of theirs with ``api_key_env`` naming any variable (SLUICE_SECRET_KEY,
SLUICE_DATABASE_URL ...), and the gateway sent that variable's value as the bearer
token. Now only SLUICE_PROVIDER_KEY_* names are accepted (console, API, and the gateway
at call time), and only an admin may change an external tier's endpoint or credential,
audited on its own."""
from __future__ import annotations

import httpx
import pytest

from app.audit.models import AuditLog
from app.catalog import service
from app.catalog.models import Tier
from app.contract.secrets import provider_key
from app.errors import Forbidden, ValidationError
from app.extensions import db
from tests.console.web import browser, login, submit
from tests.factories import UserFactory

TIER = {"name": "tier-9", "rank": 9, "model": "big", "price_input_per_m": "1",
        "price_cached_input_per_m": "0.5", "price_output_per_m": "2",
        "upstream_kind": "external", "endpoint_url": "https://attacker.example/v1",
        "api_key_env": "SLUICE_SECRET_KEY", "timeout_s": 30, "enabled": True}


@pytest.mark.parametrize("name", ["SLUICE_SECRET_KEY", "SLUICE_DATABASE_URL", "HOME",
                                  "PATH", "sluice_provider_key_x", "SLUICE_PROVIDER_KEY_"])
def test_no_variable_outside_the_namespace_is_accepted(app, name):
    admin = UserFactory(role="admin")
    with pytest.raises(ValidationError) as exc:
        service.save_tier(admin, {**TIER, "api_key_env": name})
    assert "api_key_env" in exc.value.errors
    assert db.session.scalar(db.select(db.func.count(Tier.id)).where(Tier.name == "tier-9")) == 0


def test_ops_cannot_point_a_tier_at_an_external_host_or_change_its_key(app):
    ops, admin = UserFactory(role="ops"), UserFactory(role="admin")
    ok = {**TIER, "api_key_env": "SLUICE_PROVIDER_KEY_FRONTIER"}
    with pytest.raises(Forbidden):
        service.save_tier(ops, ok)  # a new external tier
    tier = service.save_tier(admin, ok)
    for change in ({"endpoint_url": "https://evil.example/v1"},
                   {"api_key_env": "SLUICE_PROVIDER_KEY_OTHER"}):
        with pytest.raises(Forbidden) as exc:
            service.save_tier(ops, {**ok, **change}, tier.id)
        assert set(exc.value.errors) == set(change)
    # what is not about the upstream stays the ops team's job
    service.save_tier(ops, {**ok, "timeout_s": 45}, tier.id)
    db.session.expire_all()
    assert db.session.get(Tier, tier.id).endpoint_url == "https://attacker.example/v1"
    service.save_tier(admin, {**ok, "endpoint_url": "https://llm.example/v1"}, tier.id)
    audits = list(db.session.scalars(db.select(AuditLog).where(
        AuditLog.action == "tier.upstream_change", AuditLog.entity_id == str(tier.id))
        .order_by(AuditLog.id)))   # no ORDER BY: PostgreSQL may return them in any order
    assert [a.after["endpoint_url"] for a in audits] == ["https://attacker.example/v1",
                                                          "https://llm.example/v1"]
    assert audits[-1].before["endpoint_url"] == "https://attacker.example/v1"


def test_the_console_form_refuses_ops(app):
    client = browser(app)
    login(client, UserFactory(role="ops").email)
    form = {**TIER, "api_key_env": "SLUICE_PROVIDER_KEY_FRONTIER", "pool_id": "",
            "enabled": "on"}
    resp = submit(client, "/catalog/tiers/new", {k: str(v) for k, v in form.items()})
    assert resp.status_code == 403
    assert db.session.scalar(db.select(db.func.count(Tier.id)).where(Tier.name == "tier-9")) == 0


def test_the_gateway_never_reads_a_variable_outside_the_namespace():
    env = {"SLUICE_SECRET_KEY": "s3cret", "SLUICE_PROVIDER_KEY_FRONTIER": "sk-ok"}
    assert provider_key("SLUICE_SECRET_KEY", env) is None
    assert provider_key("SLUICE_PROVIDER_KEY_FRONTIER", env) == "sk-ok"
    assert provider_key("", env) is None


def test_a_tier_row_with_a_foreign_name_sends_no_secret_upstream(world, frontier):
    """A row written around the service (an old database, a direct SQL edit): the gateway
    itself refuses the name and calls the upstream without a key."""
    tier = world.tiers[3]
    tier.api_key_env = "HOME"   # set in the gateway process (it inherits the test's env)
    db.session.commit()
    from tests.gateway.conftest import publish_and_wait
    publish_and_wait(world.gateway)
    world.client().chat.completions.create(model="tier-3",
                                           messages=[{"role": "user", "content": "hi"}])
    seen = httpx.get(frontier.url + "/stats").json()
    assert "authorization" not in seen["last_headers"]
