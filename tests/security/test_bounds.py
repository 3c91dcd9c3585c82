"""Security finding 5: tenant-scoped roles act within the bounds central ops set."""
from __future__ import annotations

import pytest

from app.errors import Forbidden
from app.finops import service as finops
from app.policies.service import global_values, tenant_values, update_policy
from app.tenants.service import update_tenant
from tests.factories import TenantFactory, TierFactory, UserFactory

T1, T2, T3 = "bound-t1", "bound-t2", "bound-t3"


@pytest.fixture()
def central(app):
    from app.catalog.models import Tier
    from app.extensions import db
    for i, name in enumerate((T1, T2, T3)):
        if db.session.scalar(db.select(Tier).where(Tier.name == name)) is None:
            TierFactory(name=name, rank=90 + i)
    admin = UserFactory(role="admin")
    update_policy(admin, None, {"allowed_tiers": f"{T1},{T2}", "rate_limit_rpm": 600,
                                "max_tokens_cap": 2048, "allow_explicit_tier": False})
    yield admin
    update_policy(admin, None, {k: v for k, v in {
        "allowed_tiers": [], "rate_limit_rpm": 0, "max_tokens_cap": 4096,
        "allow_explicit_tier": True}.items()})


@pytest.mark.parametrize("values", [{"allowed_tiers": []}, {"allowed_tiers": f"{T1},{T3}"},
                                    {"rate_limit_rpm": 0}, {"rate_limit_rpm": 601},
                                    {"max_tokens_cap": 100000},
                                    {"allow_explicit_tier": True}])
def test_a_scoped_ops_user_cannot_widen_or_raise(central, values):
    tenant = TenantFactory()
    lead = UserFactory(role="ops", tenant=tenant)
    with pytest.raises(Forbidden) as exc:
        update_policy(lead, tenant.id, values)
    assert set(exc.value.errors) == set(values)
    assert tenant_values(tenant.id) == {}


def test_a_scoped_ops_user_may_narrow_and_a_central_one_may_do_anything(central):
    tenant = TenantFactory()
    lead = UserFactory(role="ops", tenant=tenant)
    update_policy(lead, tenant.id, {"allowed_tiers": T1, "rate_limit_rpm": 60,
                                    "max_tokens_cap": 512})
    assert tenant_values(tenant.id) == {"allowed_tiers": [T1], "rate_limit_rpm": 60,
                                        "max_tokens_cap": 512}
    update_policy(central, tenant.id, {"rate_limit_rpm": 0, "max_tokens_cap": 100000})
    assert tenant_values(tenant.id)["rate_limit_rpm"] == 0
    assert global_values()["rate_limit_rpm"] == 600


@pytest.mark.parametrize("values", [
    {"router_tau_1": 0.95},                   # central: calibrated on promotion
    {"margin_gamma": 0.1},                    # central: calibrated per model
    {"bounded_load_factor": 3.0},             # central: shared pools
    {"explore_pct": 50.0},                    # central: shared tier-1 capacity
    {"cache_similarity_threshold": 0.9},      # only stricter (up)
    {"shadow_concordance": 0.8},              # only stricter (up)
    {"cache_ttl_s": 10 * 86400},              # only shorter (down)
    {"canary_max_error_rate": 0.5}])          # only stricter (down)
def test_a_scoped_ops_user_may_not_loosen_or_set_central_fields(app, values):
    tenant = TenantFactory()
    lead = UserFactory(role="ops", tenant=tenant)
    with pytest.raises(Forbidden) as exc:
        update_policy(lead, tenant.id, values)
    assert set(exc.value.errors) == set(values)
    assert tenant_values(tenant.id) == {}


def test_a_scoped_ops_user_may_tighten_and_keeps_what_central_set(app):
    tenant = TenantFactory()
    lead = UserFactory(role="ops", tenant=tenant)
    admin = UserFactory(role="admin")
    # central ops gave this tenant its own tau and a longer cache life than the global one
    update_policy(admin, tenant.id, {"router_tau_1": 0.9, "cache_ttl_s": 3 * 86400})
    # the lead tightens what they may and changes what is their own; their form sends the
    # central override back unchanged (ttl) and cannot send the central field at all (tau)
    update_policy(lead, tenant.id, {"cache_similarity_threshold": 0.99,
                                    "shadow_concordance": 0.995, "minify_enabled": False,
                                    "cache_ttl_s": 3 * 86400}, replace=True)
    assert tenant_values(tenant.id) == {"router_tau_1": 0.9, "cache_ttl_s": 3 * 86400,
                                        "cache_similarity_threshold": 0.99,
                                        "shadow_concordance": 0.995, "minify_enabled": False}
    with pytest.raises(Forbidden):   # but not lengthen it further themselves
        update_policy(lead, tenant.id, {"cache_ttl_s": 5 * 86400})


def test_the_policy_form_shows_central_fields_read_only_with_the_reason(app):
    from tests.console.web import browser, login
    tenant = TenantFactory()
    lead = UserFactory(role="ops", tenant=tenant)
    web = browser(app)
    login(web, lead.email)
    html = web.get(f"/tenants/{tenant.id}/policy").get_data(as_text=True)
    tau = html.split('id="p-router_tau_1"', 1)[1].split(">", 1)[0]
    assert "disabled" in tau
    assert "Set centrally: calibrated on every router promotion" in html
    assert "You may raise it (stricter), not go below 0.965." in html
    free = html.split('id="p-minify_enabled"', 1)[1].split(">", 1)[0]
    assert "disabled" not in free


def test_status_and_adjustments_are_central(app):
    tenant = TenantFactory(status="suspended")
    with pytest.raises(Forbidden):
        update_tenant(UserFactory(role="ops", tenant=tenant), tenant.id, {"status": "active"})
    with pytest.raises(Forbidden):
        finops.record_adjustment(UserFactory(role="finops", tenant=tenant), tenant.id,
                                 "-1000000", "free money")
    update_tenant(UserFactory(role="ops", tenant=tenant), tenant.id, {"department": "Sales"})
    assert update_tenant(UserFactory(role="ops"), tenant.id, {"status": "active"}).status \
        == "active"


def test_a_tenants_own_finops_may_tighten_its_budget_never_lift_it(app):
    tenant = TenantFactory()
    central, lead = UserFactory(role="finops"), UserFactory(role="finops", tenant=tenant)
    finops.save_budget(central, tenant.id, "50", "hard_stop")
    for limit, action in (("80", "hard_stop"), ("50", "alert")):
        with pytest.raises(Forbidden) as exc:
            finops.save_budget(lead, tenant.id, limit, action)
        assert set(exc.value.errors) <= {"monthly_limit_usd", "action"} and exc.value.errors
    with pytest.raises(Forbidden):
        finops.delete_budget(lead, tenant.id)
    finops.save_budget(lead, tenant.id, "20", "hard_stop")          # tighter: fine
    (b,) = finops.list_budgets(central)
    assert b["monthly_limit_usd"] == 20 and b["action"] == "hard_stop"
    finops.delete_budget(central, tenant.id)                        # central: may
    assert finops.list_budgets(central) == []
