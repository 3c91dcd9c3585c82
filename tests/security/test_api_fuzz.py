"""Property-based fuzzing of the admin API from the OpenAPI description it publishes
(``GET /api/v1/openapi.json``): schemathesis generates valid and malformed bodies, query
strings and path values for every operation, sent as an admin (the widest role); the API
answers each with a clear 2xx/4xx, never a 5xx. Drills are left out: they run real
experiments (the MiniLM encoder, a gateway) synchronously, not input parsing."""
from __future__ import annotations

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import not_a_server_error

from app.auth.service import create_admin_token
from app.extensions import db
from tests.factories import PoolFactory, TenantFactory, TierFactory, UserFactory


MAX_EXAMPLES = int(os.environ.get("SLUICE_FUZZ_EXAMPLES", "8"))


@pytest.fixture()
def admin_headers(app):
    # a little world for ids to land on: tenant 1.., a tier, a pool
    TenantFactory()
    TierFactory(name="fuzz-tier", rank=7)
    PoolFactory(name="fuzz-pool", node="fuzznode")
    _, token = create_admin_token(UserFactory(role="admin"), "fuzz")
    return {"Authorization": f"Bearer {token}"}


def test_the_description_covers_every_api_route(app):
    doc = app.test_client().get("/api/v1/openapi.json").json
    ops = {(m.upper(), p) for p, item in doc["paths"].items() for m in item}
    routes = {(m, "/" + r.rule.removeprefix("/api/v1/")) for r in app.url_map.iter_rules()
              if r.rule.startswith("/api/v1/") and r.endpoint != "openapi_api.openapi_json"
              for m in r.methods - {"HEAD", "OPTIONS"}}
    assert len(ops) == len(routes) >= 60
    assert ("PATCH", "/tenants/{tenant_id}/policy") in ops
    policy = doc["paths"]["/tenants/{tenant_id}/policy"]["patch"]["requestBody"]
    props = policy["content"]["application/json"]["schema"]["properties"]
    assert props["cache_similarity_threshold"] == {"type": "number", "minimum": 0.5,
                                                   "maximum": 1.0}


def test_the_admin_api_never_answers_a_server_error(app, admin_headers):
    """Each operation, positive and negative (malformed) inputs; failures of all the
    operations are collected and reported together."""
    from hypothesis import given
    from schemathesis import GenerationMode
    schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", app)
    failures: dict[str, str] = {}
    walked = 0
    for result in schema.get_all_operations():
        op = result.ok()
        if op.path.startswith("/drills/"):
            continue
        walked += 1
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
                      phases=[Phase.explicit, Phase.generate],
                      suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy(generation_mode=mode))
            def run(case):
                try:
                    case.call_and_validate(headers=admin_headers,
                                           checks=[not_a_server_error])
                finally:
                    # each request its own session, as in production (the test's one app
                    # context would otherwise carry a failed transaction to the next call)
                    db.session.rollback()
            try:
                run()
            except Exception as exc:  # noqa: BLE001 - collected, reported below
                failures[f"{op.label} ({mode.value})"] = str(exc)[:1500]
    assert walked >= 60
    assert not failures, "\n\n".join(f"{k}: {v}" for k, v in failures.items())


def test_what_the_fuzzer_found_answers_4xx(app, admin_headers):
    """Each of these was a 500 before: ids past the INTEGER column (path and body), a NUL
    in text, a JSON body that is not an object, a non-text period, an over-long lock id."""
    api = app.test_client()
    h = admin_headers
    assert api.get("/api/v1/tenants/99999999999", headers=h).status_code == 404
    assert api.post("/api/v1/finops/adjustments", headers=h, json={
        "tenant_id": 99999999999, "amount": "1", "reason": "x"}).status_code == 404
    assert api.post("/api/v1/tenants", headers=h, json={"name": "a\x00b"}).status_code == 400
    assert api.post("/api/v1/tokens", headers=h, json="just a string").status_code == 400
    assert api.post("/api/v1/finops/rollups/rebuild", headers=h, json="x").status_code == 400
    assert api.post("/api/v1/finops/rollups/rebuild", headers=h,
                    json={"period": 2026.5}).status_code == 422
    assert api.post("/api/v1/auth/locks/lift", headers=h,
                    json={"email": "x" * 500 + "@example.com"}).status_code == 200
    assert api.post("/api/v1/tiers", headers=h, json={
        "name": "t", "upstream_kind": "pool", "pool_id": "abc"}).status_code == 422
    assert api.get("/api/v1/finops/dashboard?period=%00", headers=h).status_code == 400
    assert api.get("/favicon.ico?x=%00").status_code == 400
