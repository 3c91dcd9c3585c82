"""A viewer (and other roles without the permission) can read but never change anything."""
import pytest

from app.audit.models import AuditLog
from app.catalog.models import Pool, Tier
from app.extensions import db
from app.policies.models import Policy
from app.tenants.models import ApiKey, Tenant
from app.workflows.service import ensure_workflow
from tests.console.web import csrf_from
from tests.factories import PoolFactory, TenantFactory, TierFactory, UserFactory, make_key


def _snapshot():
    return {model.__name__: repr(sorted(
        (tuple(sorted(r.to_dict().items())) if hasattr(r, "to_dict") else r.id)
        for r in db.session.scalars(db.select(model))))
        for model in (Tenant, ApiKey, Tier, Pool)} | {
        "policies": repr([p.values for p in db.session.scalars(db.select(Policy))]),
        "audit": db.session.scalar(db.select(db.func.count(AuditLog.id)))}


@pytest.mark.parametrize("role", ["viewer", "finops", "approver"])
def test_read_only_roles_get_403_on_every_change(client, as_role, role):
    tenant = TenantFactory(name="alpha")
    key, _ = make_key(tenant)
    pool = PoolFactory(name="p1")
    tier = TierFactory(name="tier-1", rank=1)
    wf = ensure_workflow(tenant.id, "sig-1")
    other = UserFactory(role="viewer")
    user = as_role(role)
    pages = client.get("/tenants")
    assert pages.status_code == 200 and "alpha" in pages.get_data(as_text=True)
    for url in ("/catalog/tiers", "/catalog/pools", "/policies", f"/tenants/{tenant.id}/keys",
                f"/tenants/{tenant.id}/policy", "/workflows", "/tokens", "/"):
        assert client.get(url).status_code == 200, url
    token = csrf_from(client.get("/tokens").get_data(as_text=True))
    before = _snapshot()
    for url in ("/tenants/new", f"/tenants/{tenant.id}/edit", "/catalog/tiers/new",
                f"/catalog/tiers/{tier.id}/edit", "/catalog/pools/new",
                f"/catalog/pools/{pool.id}/edit", "/users", "/users/new",
                f"/users/{other.id}/edit", "/audit", f"/workflows/{wf.id}/edit"):
        assert client.get(url).status_code == 403, url
    posts = (("/tenants/new", {"name": "x", "status": "active"}),
             (f"/tenants/{tenant.id}/edit", {"name": "x", "status": "active"}),
             (f"/tenants/{tenant.id}/keys", {"name": "k"}),
             (f"/keys/{key.id}/revoke", {}),
             ("/catalog/tiers/new", {"name": "tier-9", "rank": "9", "model": "m",
                                     "upstream_kind": "external",
                                     "endpoint_url": "http://x/v1"}),
             (f"/catalog/tiers/{tier.id}/edit", {"name": "tier-1", "rank": "1", "model": "m2"}),
             ("/catalog/pools/new", {"name": "p9", "model": "m"}),
             (f"/catalog/pools/{pool.id}/edit", {"name": "p1", "model": "m2"}),
             ("/policies", {"margin_gamma": "0.5"}),
             (f"/tenants/{tenant.id}/policy", {"margin_gamma": "0.5"}),
             ("/users/new", {"email": "n@example.com", "password": "Long-enough-9"}),
             (f"/users/{other.id}/edit", {"email": other.email, "role": "admin"}),
             (f"/workflows/{wf.id}/edit", {"name": "renamed", "category": "code_sql"}))
    for url, data in posts:
        assert client.post(url, data={**data, "csrf_token": token}).status_code == 403, url
    db.session.expire_all()
    assert _snapshot() == before
    assert db.session.get(type(other), other.id).role == "viewer"
    # Navigation offers no admin pages.
    nav = client.get("/").get_data(as_text=True)
    assert "/users" not in nav and "/audit" not in nav and user.email in nav


def test_nav_shows_what_the_role_can_use(client, as_role):
    as_role("admin")
    nav = client.get("/").get_data(as_text=True)
    for href in ('href="/users"', 'href="/audit"', 'href="/pools"', 'href="/drills"',
                 'href="/finops"', 'href="/catalog/tiers"', 'href="/router/"',
                 'href="/routing/"', 'href="/adapters"', 'href="/workflows"', 'href="/"'):
        assert href in nav, href


def test_every_console_page_a_role_can_open_is_in_its_nav(client, as_role):
    """Each blueprint's index page that answers 200 to an admin is linked from the nav."""
    as_role("admin")
    nav = client.get("/").get_data(as_text=True).split("<nav>", 1)[1].split("</nav>", 1)[0]
    for page in ("/", "/tenants", "/catalog/tiers", "/catalog/pools", "/pools", "/policies",
                 "/workflows", "/adapters", "/router/", "/routing/", "/finops", "/drills",
                 "/cache/", "/users", "/audit", "/tokens"):
        assert client.get(page).status_code == 200, page
        assert f'href="{page}"' in nav, page


def test_error_pages_say_who_you_are_and_where_to_go(client, as_role):
    as_role("viewer")
    html = client.get("/users").get_data(as_text=True)
    assert "Not allowed" in html and "<strong>viewer</strong>" in html
    assert 'href="/"' in html
    assert client.get("/no-such-page").status_code == 404


def test_favicon_is_served(client):
    resp = client.get("/favicon.ico")
    assert resp.status_code == 200 and resp.mimetype == "image/svg+xml"


def test_ops_manages_catalog_but_not_users(client, as_role):
    as_role("ops")
    assert client.get("/catalog/tiers/new").status_code == 200
    assert client.get("/users").status_code == 403
    nav = client.get("/").get_data(as_text=True)
    assert 'href="/users"' not in nav and 'href="/drills"' in nav


def test_signed_out_visitors_are_sent_to_login(client, app):
    resp = client.get("/tenants")
    assert resp.status_code == 302 and "/login" in resp.headers["Location"]


def test_a_form_error_reads_as_sentences(app):
    from flask import render_template_string
    tpl = ('{% from "_macros.html" import form_error %}'
           '{{ form_error(msg, {"tenant_id": ["invalid"]}) }}')
    with app.test_request_context():
        assert "invalid tenant. Nothing was changed." in render_template_string(
            tpl, msg="invalid tenant")
        assert "Limit too low! Nothing was changed." in render_template_string(
            tpl, msg="Limit too low!")
