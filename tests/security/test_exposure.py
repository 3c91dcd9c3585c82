"""Security finding 13 (part): the gateway's /metrics and detailed /healthz are for
operators, not tenants on the same port; tenant-scoped users do not see pools' engine
options, nodes or replica URLs."""
from __future__ import annotations

from starlette.testclient import TestClient

from app.catalog.models import Pool, Replica
from app.extensions import db
from tests.console.web import browser, login
from tests.factories import TenantFactory, UserFactory


def _gateway(token: str = ""):
    from app.gateway.asgi import create_gateway
    from config import load_config
    cfg = load_config("test", overrides={"GATEWAY_METRICS_TOKEN": token,
                                         "GATEWAY_LEDGER_SPOOL_DIR": ""})
    return create_gateway(cfg)


def test_metrics_need_the_operator_token_when_one_is_set():
    with TestClient(_gateway("op-secret"), client=("203.0.113.9", 5000)) as c:
        assert c.get("/metrics").status_code == 403
        assert c.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 403
        ok = c.get("/metrics", headers={"Authorization": "Bearer op-secret"})
        assert ok.status_code == 200 and "sluice_gateway_requests" in ok.text
        assert set(c.get("/healthz").json()) == {"ok"}     # liveness only
        assert "ledger_backlog" in c.get(
            "/healthz", headers={"Authorization": "Bearer op-secret"}).json()


def test_without_a_token_only_the_gateways_own_host_reads_them():
    with TestClient(_gateway(), client=("203.0.113.9", 5000)) as c:
        assert c.get("/metrics").status_code == 403
    with TestClient(_gateway(), client=("127.0.0.1", 5000)) as c:
        assert c.get("/metrics").status_code == 200


def test_tenant_users_do_not_see_engine_options_or_replica_urls(app):
    pool = Pool(name="gpu-secret", model="m", engine="vllm", node="node-7",
                options={"env": {"NCCL_DEBUG": "INFO"}, "max_num_seqs": 64})
    db.session.add(pool)
    db.session.flush()
    db.session.add(Replica(pool_id=pool.id, index=0, url="http://10.9.8.7:8500",
                           state="healthy"))
    db.session.commit()
    tenant_user = UserFactory(role="viewer", tenant=TenantFactory())
    client = browser(app)
    login(client, tenant_user.email)
    html = client.get("/catalog/pools").get_data(as_text=True)
    assert "gpu-secret" in html and "NCCL_DEBUG" not in html and "node-7" not in html
    from app.auth.service import create_admin_token
    _, token = create_admin_token(tenant_user, "t")
    api = app.test_client()
    got = api.get(f"/api/v1/pools/{pool.id}", headers={"Authorization": f"Bearer {token}"})
    body = got.get_json()
    assert got.status_code == 200 and "options" not in body and "node" not in body
    assert all("url" not in r for r in body["replicas"])
    listing = api.get("/api/v1/pools", headers={"Authorization": f"Bearer {token}"}).get_json()
    assert all("options" not in p for p in listing["pools"])
    # central users still see everything
    admin = UserFactory(role="admin")
    _, atoken = create_admin_token(admin, "a")
    full = api.get(f"/api/v1/pools/{pool.id}", headers={"Authorization": f"Bearer {atoken}"})
    assert full.get_json()["options"]["max_num_seqs"] == 64
    assert full.get_json()["replicas"][0]["url"] == "http://10.9.8.7:8500"
