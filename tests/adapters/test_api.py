"""Adapters admin API: listing and filters, one adapter with its timeline and the events
the token's user may send, training (202), the rollout events, and errors as JSON."""
from __future__ import annotations

import json

from app.adapters.models import Adapter
from app.extensions import db
from tests.adapters.conftest import TRAIN_WORKFLOW, reload
from tests.factories import UserFactory


def test_list_filters_by_state_and_tenant(app, make_adapter, api_as, two_tenants):
    acme, globex = two_tenants
    a1 = make_adapter(acme, "canary")
    a2 = make_adapter(acme, "training")
    b1 = make_adapter(globex, "canary")
    client, hdr = api_as(UserFactory(role="viewer"))
    ids = lambda q: [a["id"] for a in client.get(f"/api/v1/adapters{q}",  # noqa: E731
                                                 headers=hdr).get_json()["adapters"]]
    assert ids("") == [b1.id, a2.id, a1.id]
    assert ids("?state=canary") == [b1.id, a1.id]
    assert ids(f"?tenant_id={acme.id}") == [a2.id, a1.id]
    assert ids(f"?tenant_id={acme.id}&state=canary") == [a1.id]
    bad = client.get("/api/v1/adapters?state=live", headers=hdr)
    assert bad.status_code == 422 and "state" in bad.get_json()["error"]["fields"]
    assert client.get("/api/v1/adapters?tenant_id=x", headers=hdr).status_code == 422
    assert client.get("/api/v1/adapters").status_code == 401


def test_detail_has_timeline_and_the_users_allowed_events(app, make_adapter, api_as,
                                                          two_tenants):
    adapter = make_adapter(two_tenants[0], "canary", offline={"concordance": 0.9})
    client, hdr = api_as(UserFactory(role="approver"))
    client.post(f"/api/v1/adapters/{adapter.id}/advance", headers=hdr, json={})
    got = client.get(f"/api/v1/adapters/{adapter.id}", headers=hdr).get_json()["adapter"]
    assert got["state"] == "canary" and got["canary_pct"] == 25
    assert got["offline"] == {"concordance": 0.9}
    assert [(e["event"], e["data"]) for e in got["timeline"]] == [("advance",
                                                                    {"canary_pct": 25})]
    assert got["allowed_events"] == ["advance", "promote", "rollback"]
    ops_client, ops_hdr = api_as(UserFactory(role="ops"))
    got = ops_client.get(f"/api/v1/adapters/{adapter.id}", headers=ops_hdr).get_json()
    assert got["adapter"]["allowed_events"] == ["rollback"]
    assert client.get("/api/v1/adapters/999999", headers=hdr).status_code == 404


def test_rollout_events_through_the_api(app, make_adapter, api_as, two_tenants):
    adapter = make_adapter(two_tenants[0], "awaiting_approval")
    approver = UserFactory(role="approver")
    client, hdr = api_as(approver)
    url = f"/api/v1/adapters/{adapter.id}"
    missing = client.post(f"{url}/approve", headers=hdr, json={})
    assert missing.status_code == 422
    assert missing.get_json()["error"]["fields"] == {"comment": ["an approval needs a comment"]}
    conflict = client.post(f"{url}/promote", headers=hdr, json={"comment": "x"})
    assert conflict.status_code == 409 and "awaiting approval" in conflict.get_json()[
        "error"]["message"]
    assert client.post(f"{url}/restore", headers=hdr, json={}).status_code == 404
    assert client.post(f"{url}/approve", headers=hdr, data="[1]",
                       content_type="application/json").status_code == 400
    ok = client.post(f"{url}/approve", headers=hdr, json={"comment": "good evidence"})
    assert ok.status_code == 200
    body = ok.get_json()["adapter"]
    assert body["state"] == "canary" and body["canary_pct"] == 5
    assert body["timeline"][-1]["comment"] == "good evidence"
    assert body["approved_by"] == approver.email and reload(adapter.id).state == "canary"


def test_train_through_the_api_answers_202_with_the_adapter(app, trainable, api_as):
    tenant, sent = trainable
    client, hdr = api_as(UserFactory(role="ops"))
    resp = client.post("/api/v1/adapters", headers=hdr,
                       json={"tenant_id": tenant.id, "workflow": TRAIN_WORKFLOW,
                             "hyperparams": {"rank": 8, "max_steps": 20}})
    assert resp.status_code == 202
    body = resp.get_json()["adapter"]
    assert body["state"] == "training" and body["workflow_name"] == "Invoices"
    assert body["hyperparams"]["rank"] == 8 and body["progress"]["steps"] <= 20
    assert body["allowed_events"] == ["cancel"]
    assert sent == [("adapters.train", [body["id"]])]
    again = client.post("/api/v1/adapters", headers=hdr,
                        json={"tenant_id": tenant.id, "workflow": "Invoices"})
    assert again.status_code == 409   # the workflow already has an adapter in flight
    bad = client.post("/api/v1/adapters", headers=hdr, json={"workflow": TRAIN_WORKFLOW})
    assert bad.status_code == 422 and "tenant_id" in bad.get_json()["error"]["fields"]
    bad = client.post("/api/v1/adapters", headers=hdr,
                      json={"tenant_id": tenant.id, "workflow": "x", "hyperparams": [1]})
    assert bad.status_code == 422 and "hyperparams" in bad.get_json()["error"]["fields"]
    assert db.session.scalar(db.select(db.func.count()).select_from(Adapter)) == 1
    cancel = client.post(f"/api/v1/adapters/{body['id']}/cancel", headers=hdr, json={})
    assert cancel.status_code == 200 and cancel.get_json()["adapter"]["state"] == "cancelled"


def test_retrain_replaces_a_held_back_adapter_with_one_on_the_current_traces(
        app, trainable, api_as):
    """What an ML engineer does with an adapter the shadow gate held back once more traces
    have come in: one call retires it (unloaded from its pool, as any shadow adapter
    retired) and queues a new adapter of the workflow, same hyperparameters, on the traces
    there are now; refused while no trace has come in, and from a state that serves."""
    from app.adapters.models import AdapterEvent, AdapterTrace
    tenant, sent = trainable
    client, hdr = api_as(UserFactory(role="ops"))
    first = client.post("/api/v1/adapters", headers=hdr,
                        json={"tenant_id": tenant.id, "workflow": TRAIN_WORKFLOW,
                              "hyperparams": {"rank": 4, "max_steps": 5}}).get_json()["adapter"]
    held = reload(first["id"])
    held.state = "shadow"                     # trained, then held back by the gate
    held.shadow = {"requests": 20, "agreed": 17, "concordance": 0.85}
    db.session.commit()
    got = client.get(f"/api/v1/adapters/{held.id}", headers=hdr).get_json()["adapter"]
    assert "retrain" in got["allowed_events"]

    same = client.post(f"/api/v1/adapters/{held.id}/retrain", headers=hdr, json={})
    assert same.status_code == 422 and "no new traces" in same.get_json()["error"]["message"]
    assert reload(held.id).state == "shadow"  # the refusal changed nothing
    assert db.session.scalar(db.select(db.func.count()).select_from(Adapter)) == 1

    db.session.add_all([AdapterTrace(
        request_id=f"req_more_{tenant.id}_{i:03d}", tenant_id=tenant.id, workflow=TRAIN_WORKFLOW,
        tier="tier-3", answer=json.dumps({"invoice": 100 + i}),
        messages=[{"role": "user", "content": f"invoice {100 + i}"}]) for i in range(12)])
    db.session.commit()
    sent.clear()
    resp = client.post(f"/api/v1/adapters/{held.id}/retrain", headers=hdr,
                       json={"comment": "shadow 17/20; 12 more traces"})
    assert resp.status_code == 202
    new = resp.get_json()["adapter"]
    assert new["id"] != held.id and new["state"] == "training"
    assert new["workflow"] == TRAIN_WORKFLOW and new["hyperparams"] == held.hyperparams
    old = reload(held.id)
    assert old.state == "retired"
    new_ds = reload(new["id"]).dataset
    assert new_ds.n_train + new_ds.n_heldout == 52 and new_ds.id != old.dataset_id
    retire_event = old.events[-1]
    assert (retire_event.event, retire_event.to_state) == ("retire", "retired")
    assert retire_event.comment == "shadow 17/20; 12 more traces"
    request_event = db.session.scalar(db.select(AdapterEvent).where(
        AdapterEvent.adapter_id == new["id"], AdapterEvent.event == "request"))
    assert request_event.data["retrain_of"] == held.id
    assert sorted(sent) == [("adapters.train", [new["id"]]), ("adapters.unload", [held.id])]

    again = client.post(f"/api/v1/adapters/{new['id']}/retrain", headers=hdr, json={})
    assert again.status_code == 409           # in training: cancel it first
    promoted = reload(new["id"])
    promoted.state = "promoted"
    db.session.commit()
    assert client.post(f"/api/v1/adapters/{promoted.id}/retrain", headers=hdr,
                       json={}).status_code == 409
    viewer, vhdr = api_as(UserFactory(role="approver"))
    assert viewer.post(f"/api/v1/adapters/{old.id}/retrain", headers=vhdr,
                       json={}).status_code == 403
