"""Global policy and tenant overrides in the console."""
from markupsafe import escape

from app.audit.models import AuditLog
from app.extensions import db
from app.contract import policy as schema
from app.policies.service import effective_policy, global_values, tenant_values
from tests.console.web import submit
from tests.factories import TenantFactory


def test_policy_page_lists_every_field_with_help_and_default(client, admin):
    html = client.get("/policies").get_data(as_text=True)
    for name, field in schema.FIELDS.items():
        assert f'name="{name}"' in html, name
        assert str(escape(field.help)) in html, name
    assert "0.965" in html and "0.78" in html


def test_global_change_is_audited_and_inherited_by_tenants(client, admin):
    tenant = TenantFactory(name="alpha")
    resp = submit(client, "/policies", {"margin_gamma": "0.9", "minify_enabled": "false"})
    assert resp.status_code == 302
    assert global_values() == {"margin_gamma": 0.9, "minify_enabled": False}
    row = db.session.scalar(db.select(AuditLog).where(AuditLog.action == "policy.update"))
    assert row.before == {} and row.after["margin_gamma"] == 0.9
    html = client.get(f"/tenants/{tenant.id}/policy").get_data(as_text=True)
    assert 'placeholder="0.9"' in html  # the inherited value is shown


def test_tenant_override_then_clearing_it_inherits_again(client, admin):
    tenant = TenantFactory(name="alpha")
    url = f"/tenants/{tenant.id}/policy"
    assert submit(client, url, {"cache_similarity_threshold": "0.98",
                                "cache_salt": "true"}).status_code == 302
    assert tenant_values(tenant.id) == {"cache_similarity_threshold": 0.98, "cache_salt": True}
    assert effective_policy(tenant.id)["margin_gamma"] == 0.78
    html = client.get(url).get_data(as_text=True)
    assert 'value="0.98"' in html
    assert submit(client, url, {"cache_similarity_threshold": ""}).status_code == 302
    assert tenant_values(tenant.id) == {}
    rows = list(db.session.scalars(db.select(AuditLog).where(AuditLog.tenant_id == tenant.id)
                                   .order_by(AuditLog.id)))
    assert rows[-1].before == {"cache_similarity_threshold": 0.98, "cache_salt": True}
    assert rows[-1].after == {}


def test_invalid_policy_shows_field_errors_and_changes_nothing(client, admin):
    tenant = TenantFactory(name="alpha")
    url = f"/tenants/{tenant.id}/policy"
    submit(client, url, {"margin_gamma": "1.5"})
    resp = submit(client, url, {"router_tau_1": "0.5", "router_tau_2": "0.9"})
    assert resp.status_code == 422
    assert "router_tau_1 must be at least router_tau_2" in resp.get_data(as_text=True)
    resp = submit(client, url, {"cache_similarity_threshold": "1.7", "max_tokens_cap": "lots",
                                "allowed_tiers": "no-such-tier"})
    html = resp.get_data(as_text=True)
    assert resp.status_code == 422
    assert "must be between 0.5 and 1" in html and "must be a whole number" in html
    assert "unknown tiers: no-such-tier" in html and 'value="lots"' in html
    assert tenant_values(tenant.id) == {"margin_gamma": 1.5}
    assert db.session.scalar(db.select(db.func.count(AuditLog.id))) == 1


def test_scoped_lead_edits_own_tenant_policy_but_not_the_global(client, as_role):
    alpha = TenantFactory(name="alpha")
    as_role("ops", tenant=alpha)
    assert submit(client, f"/tenants/{alpha.id}/policy",
                  {"rate_limit_rpm": "600"}).status_code == 302
    assert tenant_values(alpha.id) == {"rate_limit_rpm": 600}
    resp = submit(client, f"/tenants/{alpha.id}/policy", {"margin_gamma": "0.1"},
                  action="/policies")
    assert resp.status_code == 403 and global_values() == {}


def test_saving_a_policy_says_which_adapters_keep_the_form_they_learned(client, admin):
    from app.adapters.models import Adapter
    from app.contract.policy import form_of
    tenant = TenantFactory(name="alpha")
    learned = form_of(effective_policy(tenant.id))   # minify on, as the defaults have it
    db.session.add_all([
        Adapter(tenant_id=tenant.id, workflow="wf", name=f"lora-kept-{tenant.id}",
                state="promoted", form=learned),
        Adapter(tenant_id=tenant.id, workflow="wf2", name=f"lora-old-{tenant.id}",
                state="retired", form=learned),
        Adapter(tenant_id=tenant.id, workflow="wf3", name=f"lora-none-{tenant.id}",
                state="shadow")])   # from before forms were kept
    db.session.commit()
    url = f"/tenants/{tenant.id}/policy"
    html = client.get(submit(client, url, {"margin_gamma": "0.9"}).location).get_data(
        as_text=True)
    assert "Policy saved." in html and "keep being served" not in html
    html = client.get(submit(client, url, {"minify_enabled": "false"}).location).get_data(
        as_text=True)
    assert f"lora-kept-{tenant.id} (minify_enabled)" in html and "keep being served" in html
    assert f"lora-old-{tenant.id}" not in html and f"lora-none-{tenant.id}" not in html
