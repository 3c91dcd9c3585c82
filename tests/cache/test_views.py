"""Cache invalidation from the console page and the admin API (same service, audited)."""
from app.audit.models import AuditLog
from app.auth.service import create_admin_token
from app.contract.cache.embedding import embed
from app.contract.cache.keys import build_key
from app.cache.service import get_store
from app.extensions import db
from app.contract.policy import DEFAULTS
from app.workflows.service import ensure_workflow
from tests.api.conftest import Api
from tests.console.web import browser, csrf_from, login
from tests.factories import TenantFactory, UserFactory

ANSWER = {"choices": [{"index": 0, "finish_reason": "stop",
                       "message": {"role": "assistant", "content": "cached"}}]}


def _put(tenant_id, text, workflow=None, rid=None):
    key = build_key(str(tenant_id), DEFAULTS, "auto",
                    {"temperature": 0, "messages": [{"role": "user", "content": text}]})
    vec = embed(key.text)
    get_store().store(key, vec, ANSWER, rid or f"r-{tenant_id}-{abs(hash(text))}", 600, workflow)
    return key, vec


def _found(key, vec) -> bool:
    """Neither the exact entry nor the semantic bucket still answers."""
    store = get_store()
    exact = store.lookup(key, None, 0.965) is not None
    semantic = store._semantic_redis(key, vec, 0.965) is not None
    assert exact == semantic, (exact, semantic)
    return exact


def _api(app, role, tenant=None) -> Api:
    user = UserFactory(role=role, tenant=tenant)
    return Api(browser(app), create_admin_token(user, "t")[1])


def _audits():
    return list(db.session.scalars(db.select(AuditLog).where(AuditLog.action == "cache.invalidate")
                                   .order_by(AuditLog.id)))


def test_api_invalidates_one_tenant_only_and_audits(app):
    a, b = TenantFactory(), TenantFactory()
    ea, eb = _put(a.id, "Warranty for SKU-1 in Utah?"), _put(b.id, "Warranty for SKU-1 in Utah?")
    assert _found(*ea) and _found(*eb)
    resp = _api(app, "ops").post("/cache/invalidate", json={"scope": "tenant", "tenant_id": a.id})
    assert resp.status_code == 200, resp.get_json()
    assert resp.get_json() == {"scope": "tenant", "tenant_id": a.id, "removed": 1}
    assert not _found(*ea) and _found(*eb)
    (row,) = _audits()
    assert row.tenant_id == a.id and row.after == {"tenant_id": a.id, "workflow": None, "removed": 1}


def test_api_viewer_gets_403_and_nothing_goes(app):
    a = TenantFactory()
    entry = _put(a.id, "Refund window for ORD-77?")
    for scope in ({"scope": "tenant", "tenant_id": a.id}, {"scope": "all"}):
        resp = _api(app, "viewer").post("/cache/invalidate", json=scope)
        assert resp.status_code == 403, resp.get_json()
    assert _found(*entry) and _audits() == []


def test_api_scoped_user_cannot_touch_another_tenant(app):
    mine, other = TenantFactory(), TenantFactory()
    e_mine, e_other = _put(mine.id, "Quota for tier-2?"), _put(other.id, "Quota for tier-2?")
    api = _api(app, "ops", tenant=mine)
    assert api.post("/cache/invalidate", json={"scope": "tenant", "tenant_id": other.id}).status_code == 403
    assert api.post("/cache/invalidate", json={"scope": "all"}).status_code == 403
    assert _found(*e_other) and _found(*e_mine) and _audits() == []
    resp = api.post("/cache/invalidate", json={"scope": "tenant", "tenant_id": mine.id})
    assert resp.status_code == 200 and resp.get_json()["removed"] == 1
    assert not _found(*e_mine) and _found(*e_other)


def test_api_scoped_user_cannot_name_another_tenants_workflow(app):
    mine, other = TenantFactory(), TenantFactory()
    wf = ensure_workflow(other.id, "sig-other")
    entry = _put(other.id, "Latency in eu-west-1?", workflow="sig-other")
    resp = _api(app, "admin", tenant=mine).post("/cache/invalidate",
                                                json={"scope": "workflow", "workflow_id": wf.id})
    assert resp.status_code == 404  # never confirms another tenant's workflow exists
    assert _found(*entry)


def test_api_workflow_scope_leaves_the_tenants_other_entries(app):
    t = TenantFactory()
    wf = ensure_workflow(t.id, "sig-billing")
    in_wf = _put(t.id, "Invoice total for Globex in March?", workflow="sig-billing", rid="w1")
    outside = _put(t.id, "Invoice total for Hooli in March?", workflow="sig-support", rid="w2")
    resp = _api(app, "ops").post("/cache/invalidate", json={"scope": "workflow", "workflow_id": wf.id})
    assert resp.status_code == 200 and resp.get_json()["removed"] == 1
    assert not _found(*in_wf) and _found(*outside)
    assert _audits()[0].after["workflow"] == "sig-billing"


def test_api_all_and_bad_requests(app):
    a, b = TenantFactory(), TenantFactory()
    ea, eb = _put(a.id, "Price of SKU-9?"), _put(b.id, "Price of SKU-9?")
    api = _api(app, "admin")
    assert api.post("/cache/invalidate", json={"scope": "tenant"}).status_code == 422
    assert api.post("/cache/invalidate", json={"scope": "galaxy"}).status_code == 422
    assert api.post("/cache/invalidate", json={"scope": "tenant", "tenant_id": 10 ** 9}).status_code == 404
    assert _found(*ea) and _found(*eb)
    resp = api.post("/cache/invalidate", json={"scope": "all"})
    assert resp.status_code == 200 and resp.get_json()["removed"] >= 2
    assert not _found(*ea) and not _found(*eb)
    assert _audits()[-1].after["tenant_id"] is None


def test_console_page_invalidates_with_csrf(app):
    a, b = TenantFactory(), TenantFactory()
    ea, eb = _put(a.id, "Warranty for SKU-5?"), _put(b.id, "Warranty for SKU-5?")
    client = browser(app)
    login(client, UserFactory(role="ops").email)
    page = client.get("/cache/")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert 'value="all"' in html and a.name in html
    assert client.post("/cache/invalidate", data={"scope": "tenant", "tenant_id": a.id,
                                                  "csrf_token": "forged"}).status_code == 400
    assert _found(*ea)
    resp = client.post("/cache/invalidate", data={"scope": "tenant", "tenant_id": a.id,
                                                  "csrf_token": csrf_from(html)})
    assert resp.status_code == 303
    assert not _found(*ea) and _found(*eb)
    assert "1 entries removed" in client.get("/cache/").get_data(as_text=True)
    assert _audits()[0].tenant_id == a.id


def test_console_viewer_and_scoped_user(app):
    mine, other = TenantFactory(), TenantFactory()
    e_other = _put(other.id, "Warranty for SKU-6?")
    viewer = browser(app)
    login(viewer, UserFactory(role="viewer").email)
    assert viewer.get("/cache/").status_code == 403
    assert 'href="/cache/"' not in viewer.get("/").get_data(as_text=True)
    scoped = browser(app)
    login(scoped, UserFactory(role="ops", tenant=mine).email)
    html = scoped.get("/cache/").get_data(as_text=True)
    assert 'value="all"' not in html and other.name not in html and mine.name in html
    token = csrf_from(html)
    for data in ({"scope": "tenant", "tenant_id": other.id}, {"scope": "all"}):
        assert scoped.post("/cache/invalidate", data={**data, "csrf_token": token}).status_code == 403
    assert _found(*e_other) and _audits() == []


def test_cache_page_shows_the_verified_cache_per_tenant_and_workflow(app, redis_client):
    """Hit rate from the ledger, hits by how they were judged, the measured error of the
    checked candidates with its interval, the bound and evictions (Redis counters)."""
    from app.contract.cache.quality import CacheQuality
    from app.ledger.models import LedgerEntry
    tenant = TenantFactory()
    db.session.commit()
    for i, cache in enumerate(["miss", "miss", "exact", "semantic"]):
        db.session.add(LedgerEntry(request_id=f"q22-{tenant.id}-{i}", tenant_id=tenant.id,
                                   workflow="wf22", tier="t", model="m", status=200,
                                   cache=cache, cost_usd=0, baseline_cost_usd=0))
    db.session.commit()
    q = CacheQuality(redis_client, app.config["REDIS_NAMESPACE"])
    for agreed in (True, True, True, False):
        q.observe(tenant.id, "wf22", 0.91, agreed, "check")
    q.count(tenant.id, "wf22", "hits_verified")
    q.count(tenant.id, "wf22", "hits_exact")
    q.count(tenant.id, "wf22", "evicted")
    client = browser(app)
    login(client, UserFactory(role="admin").email)
    html = client.get("/cache/").get_data(as_text=True)
    row = html[html.index(tenant.name):]
    row = row[:row.index("</tr>")]
    assert "wf22" in row and "50.0%" in row          # 2 hits of 4 requests
    assert "25.00%" in row                            # 1 of 4 checked disagreed
    assert "0.10%" in row                             # the default bound
    assert ">1</td>" in row                           # evictions, verifier hits


def test_cache_page_shows_what_sampled_verification_cost_per_workflow(app):
    """The ``cache_verify`` ledger rows of the last 7 days summed per tenant and workflow,
    shown to the micro-dollar as FinOps shows money; other kinds, other workflows and older
    rows stay out, and a workflow with only verification runs still gets its row."""
    from datetime import timedelta
    from decimal import Decimal

    from app.core.costing import format_usd
    from app.ledger.models import LedgerEntry
    from app.models_base import utcnow
    tenant = TenantFactory()
    db.session.commit()

    def book(i, kind, workflow, cost, days_ago=0):
        db.session.add(LedgerEntry(request_id=f"v22-{tenant.id}-{i}", kind=kind,
                                   tenant_id=tenant.id, workflow=workflow, tier="t", model="m",
                                   status=200, cache="semantic" if kind == "request" else "miss",
                                   cost_usd=Decimal(cost), baseline_cost_usd=0,
                                   at=utcnow() - timedelta(days=days_ago)))
    book(0, "request", "wfv", "0.5")                         # the served hit: not sampling
    book(1, "cache_verify", "wfv", "0.0000123456")
    book(2, "cache_verify", "wfv", "0.0000004321")
    book(3, "cache_verify", "wfv", "0.9", days_ago=8)         # before the page's 7 days
    book(4, "shadow", "wfv", "0.7")                           # another off-path kind
    book(5, "cache_verify", "wfonly", "0.0000000004")         # under a micro-dollar
    db.session.commit()
    client = browser(app)
    login(client, UserFactory(role="admin").email)
    html = client.get("/cache/").get_data(as_text=True)
    rows = [r[:r.index("</tr>")] for r in html.split("<tr>") if tenant.name in r]
    (wfv,) = [r for r in rows if 'title="wfv"' in r]
    (wfonly,) = [r for r in rows if 'title="wfonly"' in r]
    assert format_usd(Decimal("0.0000127777")) == "$0.000013"
    assert '<td class="verify-cost">$0.000013 (2 runs)</td>' in wfv
    assert '<td class="verify-cost">&lt;$0.000001 (1 run)</td>' in wfonly
