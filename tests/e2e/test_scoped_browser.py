"""In headless Chromium, ops scoped to one tenant: central fields of their tenant's
policy are read-only with the reason, loosening a bound is refused with its figure and
changes nothing, tightening is saved; the global policy is not theirs to change."""
from __future__ import annotations

from app.extensions import db
from app.policies.service import tenant_values
from tests.e2e.conftest import sign_in
from tests.factories import TenantFactory, UserFactory


def test_a_tenant_scoped_ops_user_cannot_change_what_their_role_must_not(app, console, page):
    tenant = TenantFactory(name="support-dept")
    lead = UserFactory(role="ops", tenant=tenant)
    sign_in(page, console, lead.email)
    page.goto(console + f"/tenants/{tenant.id}/policy")
    assert page.is_disabled("#p-router_tau_1") and page.is_disabled("#p-margin_gamma")
    assert "Set centrally" in page.inner_text("body")
    page.fill("#p-cache_similarity_threshold", "0.9")
    page.click("button:has-text('Save policy')")
    page.wait_for_selector(".field-error")
    assert "central bound: at least 0.965" in page.inner_text("body")
    db.session.expire_all()
    assert tenant_values(tenant.id) == {}

    page.fill("#p-cache_similarity_threshold", "0.99")
    page.click("button:has-text('Save policy')")
    page.wait_for_selector("text=Policy saved.")
    db.session.expire_all()
    assert tenant_values(tenant.id) == {"cache_similarity_threshold": 0.99}

    page.goto(console + "/policies")
    assert page.locator("button:has-text('Save policy')").count() == 0
