"""Drills over the admin API (/api/v1/drills): the same service functions and checks as the
Drills page; read-only roles get 403 and start nothing."""
from __future__ import annotations

from app.auth.service import create_admin_token
from app.drills.service import list_runs
from app.extensions import db
from app.redis_client import keys
from tests.console.web import browser
from tests.factories import UserFactory

PAIRS = [{"a": "What is the warranty for SKU-4821 in California?",
          "b": "What is the warranty for SKU-4829 in California?", "same": False, "kind": "id"},
         {"a": "How do I reset my password?", "b": "How do I reset my password",
          "same": True, "kind": "paraphrase"}]


def _api(app, role: str):
    user = UserFactory(role=role)
    _row, token = create_admin_token(user, "test")
    client, headers = browser(app), {"Authorization": f"Bearer {token}"}

    def call(method: str, path: str, json=None):
        return client.open(f"/api/v1{path}", method=method, json=json, headers=headers)
    return call


def test_read_only_roles_cannot_run_or_list_drills(app, redis_client):
    for role in ("viewer", "finops", "approver"):
        api = _api(app, role)
        assert api("GET", "/drills").status_code == 403
        for path, payload in (("/drills/cache-poisoning", {"pairs": PAIRS}),
                              ("/drills/domain-shift", {"key": "sk-x", "url": "http://x"}),
                              ("/drills/replica-loss", {"key": "sk-x", "pool_id": 1})):
            resp = api("POST", path, payload)
            assert resp.status_code == 403, (role, path, resp.json)
            assert resp.json["error"]["code"] == "forbidden"
    assert list_runs() == []
    assert not list(redis_client.scan_iter(keys().k("drill", "secret", "*")))


def test_ops_run_cache_poisoning_inline_and_see_it_listed(app):
    api = _api(app, "ops")
    resp = api("POST", "/drills/cache-poisoning", {"pairs": PAIRS})
    assert resp.status_code == 200, resp.json
    report = resp.json
    assert report["pairs"] == 2 and report["false_hits"] == 0
    assert report["by_kind"]["id"]["false_hits"] == 0
    runs = api("GET", "/drills?kind=cache-poisoning").json["runs"]
    assert [r["id"] for r in runs] == [report["run_id"]]
    assert runs[0]["params"]["source"] == "api" and runs[0]["status"] == "passed"


def test_bad_drill_input_gets_field_errors_and_starts_nothing(app, redis_client):
    api = _api(app, "ops")
    bad = api("POST", "/drills/cache-poisoning", {"pairs": [{"a": "x"}], "threshold": 2})
    assert bad.status_code == 422 and set(bad.json["error"]["fields"]) == {"threshold"}
    bad = api("POST", "/drills/cache-poisoning", {"pairs": [{"a": "x"}]})
    assert bad.status_code == 422 and "pairs" in bad.json["error"]["fields"]
    bad = api("POST", "/drills/domain-shift", {"key": "sk-x", "n_ood": "many",
                                               "max_tokens": 1.5})
    assert bad.status_code == 422
    assert set(bad.json["error"]["fields"]) == {"n_ood", "max_tokens"}
    nokey = api("POST", "/drills/domain-shift", {"url": "http://127.0.0.1:1"})
    assert nokey.status_code == 422 and "key" in nokey.json["error"]["fields"]
    nopool = api("POST", "/drills/replica-loss", {"key": "sk-x", "url": "http://127.0.0.1:1"})
    assert nopool.status_code == 422, nopool.json
    assert api("POST", "/drills/replica-loss", ["not", "an", "object"]).status_code == 400
    db.session.expire_all()
    assert list_runs() == []
    assert not list(redis_client.scan_iter(keys().k("drill", "secret", "*")))
