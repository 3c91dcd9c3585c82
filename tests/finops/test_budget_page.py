"""The Budgets page: edit an existing budget (the form comes filled), a removal asks
first, and with no tenant to budget the page says what to do instead of showing nothing."""
from __future__ import annotations

from decimal import Decimal

from app.finops import service
from tests.console.web import browser, csrf_from, login
from tests.factories import TenantFactory, UserFactory


def test_edit_fills_the_form_and_saving_replaces_the_budget(app):
    tenant = TenantFactory(name="acme")
    finops = UserFactory(role="finops")
    service.save_budget(finops, tenant.id, "0.0046", "hard_stop",
                        webhook_url="")
    web = browser(app)
    login(web, finops.email)
    page = web.get("/finops/budgets").get_data(as_text=True)
    row = page.split('data-tenant="acme"', 1)[1].split("</tr>", 1)[0]
    assert "$0.0046" in row and f"/finops/budgets?edit={tenant.id}" in row
    assert 'data-confirm="Remove the budget of acme?' in row
    form = web.get(f"/finops/budgets?edit={tenant.id}").get_data(as_text=True)
    assert "Edit the budget of acme" in form
    shown = form.split('id="f-monthly_limit_usd" value="', 1)[1].split('"', 1)[0]
    assert Decimal(shown) == Decimal("0.0046")
    assert '<option value="hard_stop" selected>' in form
    resp = web.post("/finops/budgets", data={"csrf_token": csrf_from(form),
                                             "tenant_id": str(tenant.id),
                                             "monthly_limit_usd": "12.5", "action": "alert",
                                             "webhook_url": ""})
    assert resp.status_code == 302
    (b,) = service.list_budgets(finops)
    assert str(b["monthly_limit_usd"]).startswith("12.5") and b["action"] == "alert"


def test_without_tenants_the_page_says_what_to_do(app):
    web = browser(app)
    login(web, UserFactory(role="finops").email)
    html = web.get("/finops/budgets").get_data(as_text=True)
    assert 'id="no-tenants"' in html and "create one under" in html
    viewer = browser(app)
    login(viewer, UserFactory(role="viewer").email)
    TenantFactory()
    assert "can see budgets but not set them" in viewer.get("/finops/budgets").get_data(
        as_text=True)
