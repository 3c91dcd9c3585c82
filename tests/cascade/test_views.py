import re

from app.policies.service import effective_policy
from app.cascade import service
from tests.factories import TenantFactory, UserFactory
from tests.cascade.helpers import traces


def login(client, user):
    with client.session_transaction() as s:
        s["_user_id"] = user.get_id()  # "<id>.<session epoch>"
        s["_fresh"] = True


def csrf(html: str) -> str:
    return re.search(r'name="csrf_token" value="([^"]+)"', html).group(1)


def test_scope_page_shows_versions_charts_and_sets_tau(app, client):
    t = TenantFactory()
    scope = f"tenant:{t.id}"
    model = service.train_scope(scope, traces(800, seed=5))
    ops = UserFactory(role="ops")   # τ is calibrated centrally: a global user sets it
    login(client, ops)
    index = client.get("/router/")
    assert index.status_code == 200 and scope in index.text
    page = client.get(f"/router/scope/{scope}")
    assert page.status_code == 200
    html = page.text
    assert "v1" in html and "ECE raw" in html and "Set τ by quality target" in html
    assert html.count("Plotly.newPlot") == 2
    assert "/router/plotly.js" in html
    js = client.get("/router/plotly.js")
    assert js.status_code == 200 and len(js.data) > 1_000_000

    # without the CSRF token the form is refused
    assert client.post(f"/router/models/{model.id}/taus",
                       data={"quality_target": "99"}).status_code == 400
    resp = client.post(f"/router/models/{model.id}/taus",
                       data={"quality_target": "99", "csrf_token": csrf(html)})
    assert resp.status_code == 302
    want = service.taus_for_target(model, 0.99)
    pol = effective_policy(t.id)
    assert (pol["router_tau_1"], pol["router_tau_2"]) == (want["router_tau_1"], want["router_tau_2"])


def test_viewer_cannot_set_tau_and_other_tenants_see_nothing(app, client):
    t, other = TenantFactory(), TenantFactory()
    model = service.train_scope(f"tenant:{t.id}", traces(800, seed=6))
    own = service.model_taus(model)   # frontier only: 160 held-out rows cannot prove 0.8%
    viewer = UserFactory(role="viewer", tenant=t)
    login(client, viewer)
    html = client.get(f"/router/scope/tenant:{t.id}").text
    assert "Set τ by quality target" not in html
    token = csrf(html)
    before = effective_policy(t.id)["router_tau_1"]
    assert client.post(f"/router/models/{model.id}/taus",
                       data={"quality_target": "99", "csrf_token": token}).status_code == 403
    assert effective_policy(t.id)["router_tau_1"] == before
    # τ is calibrated centrally: the tenant's own ops may not set it either
    login(client, UserFactory(role="ops", tenant=t))
    token = csrf(client.get(f"/router/scope/tenant:{t.id}").text)
    assert client.post(f"/router/models/{model.id}/taus",
                       data={"quality_target": "99", "csrf_token": token}).status_code == 403
    assert effective_policy(t.id)["router_tau_1"] == before
    assert service.model_taus(service.get_model(None, model.id)) == own
    login(client, UserFactory(role="ops", tenant=other))
    assert client.get(f"/router/scope/tenant:{t.id}").status_code == 404
    assert f"tenant:{t.id}" not in client.get("/router/").text


def test_admin_api_sets_tau_like_the_console(app, client):
    from app.auth.service import create_admin_token
    t = TenantFactory()
    model = service.train_scope(f"tenant:{t.id}", traces(800, seed=8))
    ops = UserFactory(role="ops")
    _, token = create_admin_token(ops, "ci")
    auth = {"Authorization": f"Bearer {token}"}
    listed = client.get(f"/api/v1/router/scopes/tenant:{t.id}/models", headers=auth).get_json()
    assert [m["version"] for m in listed["models"]] == [1]
    assert listed["models"][0]["chosen"]["relative_quality"] >= 0.99
    resp = client.post(f"/api/v1/router/models/{model.id}/taus", json={"quality_target": 0.99},
                       headers=auth)
    assert resp.status_code == 200
    assert effective_policy(t.id)["router_tau_1"] == resp.get_json()["taus"]["router_tau_1"]
    bad = client.post(f"/api/v1/router/models/{model.id}/taus", json={"quality_target": "x"},
                      headers=auth)
    assert bad.status_code == 422
