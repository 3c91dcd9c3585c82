"""Adapters console: the list and its filter, the evidence on the detail page, the buttons
the state table allows, what a refusal looks like, and the train form."""
from __future__ import annotations

import json
import re

import pytest

from app.adapters.models import AdapterEvent
from app.extensions import db
from tests.adapters.conftest import TRAIN_WORKFLOW, queued_lora, reload
from tests.console.web import csrf_from, submit
from tests.factories import UserFactory

EVIDENCE = dict(
    sha256="a" * 64,
    hyperparams={"rank": 32, "alpha": 64, "lr": 0.0002,
                 "target_modules": ["q_proj", "v_proj"]},
    offline={"concordance": 0.912, "ci_low": 0.85, "ci_high": 0.951, "n": 120,
             "base_concordance": 0.41, "latency_ms": 38.25, "tokens": 41.5,
             "cost_per_1k_before": "4.200000", "cost_per_1k_after": "0.035210",
             "cost_before_source": "ledger: 812 requests in 2026-11-27..today",
             "samples": [{"prompt": "Order #A123: 3 x bolt", "reference": '{"qty":3}',
                          "candidate": '{"qty":3}', "match": True},
                         {"prompt": "Order #B777: 9 x valve", "reference": '{"qty":9}',
                          "candidate": '{"qty":6}', "match": False}]},
    shadow={"requests": 250, "agreed": 220, "concordance": 0.88, "ci_low": 0.83,
            "ci_high": 0.92},
    progress={"step": 40, "steps": 100, "loss": 0.4321, "eta_s": 75,
              "history": [[1, 2.5], [20, 1.1], [40, 0.4321]]},
    live={"answers": 80, "errors": 1, "error_rate": 0.0125, "error_ci": [0.0022, 0.0676],
          "verdicts": 20, "passed": 19, "pass_rate": 0.95, "pass_ci": [0.7639, 0.9911]},
    loaded={"3": "ok", "4": "error: out of memory"},
    error="replica 4 could not load the adapter")


def test_list_shows_each_adapters_figures_and_filters_by_state(app, make_adapter, sign_in,
                                                                two_tenants):
    acme, globex = two_tenants
    canary = make_adapter(acme, "canary", canary_pct=25, approved_by="ann@example.com",
                          offline={"concordance": 0.912}, shadow={"concordance": 0.88})
    make_adapter(globex, "training", workflow_name="refunds")
    web, _ = sign_in("viewer")
    html = web.get("/adapters").get_data(as_text=True)
    row = html.split(f'data-adapter="{canary.id}"', 1)[1].split("</tr>", 1)[0]
    for shown in ("acme", canary.workflow_name, "canary", "25%", "91.2%", "88.0%", "system",
                  "ann@example.com"):
        assert shown in row, shown
    assert "refunds" in html and 'href="/adapters"' in html   # the nav link
    only_canary = web.get("/adapters?state=canary").get_data(as_text=True)
    assert canary.workflow_name in only_canary and "refunds" not in only_canary
    assert "No adapters promoted yet" in web.get("/adapters?state=promoted").get_data(
        as_text=True)


def test_detail_shows_the_evidence(app, make_adapter, sign_in, two_tenants):
    adapter = make_adapter(two_tenants[0], "canary", canary_pct=25, **EVIDENCE)
    web, _ = sign_in("viewer")
    resp = web.get(f"/adapters/{adapter.id}")
    html = resp.get_data(as_text=True)
    assert resp.status_code == 200
    for shown in ("smollm2-135m", "a" * 64, "q_proj, v_proj", "0.0002",          # manifest
                  "91.2%", "85.0% – 95.1%", "120", "41.0%", "38.2 ms", "41.5",   # offline
                  "250", "220", "88.0%", "83.0% – 92.0%",                       # shadow
                  "$4.20", "$0.03521", "ledger: 812 requests",                  # cost
                  "1.2%", "0.2% – 6.8%", "of 20 verdicts (76.4% – 99.1%)",      # live
                  "Step 40 of 100", "0.4321",                                    # training
                  "error: out of memory", "replica 4 could not load the adapter",
                  "25% of traffic"):
        assert shown in html, shown
    samples = html.split('id="samples"', 1)[1].split("</section>", 1)[0]
    assert "Order #B777: 9 x valve" in samples and "{&#34;qty&#34;:6}" in samples
    assert samples.count("match</span>") == 1 and samples.count("differs</span>") == 1
    # the loss curve is drawn by the bundled Plotly, from a script this response allows
    assert '<script src="/adapters/plotly.js">' in html and 'id="loss-chart"' in html
    nonce = re.search(r"'nonce-([\w-]+)'", resp.headers["Content-Security-Policy"]).group(1)
    script = html.split(f'<script nonce="{nonce}">', 1)[1].split("</script>", 1)[0]
    loss = json.loads(script.split("const LOSS = ", 1)[1].split(";\n", 1)[0])
    assert loss["data"][0]["x"] == [1, 20, 40] and loss["data"][0]["y"] == [2.5, 1.1, 0.4321]
    assert web.get("/adapters/plotly.js").status_code == 200


def test_detail_without_evidence_shows_dashes_and_no_chart(app, make_adapter, sign_in,
                                                           two_tenants):
    adapter = make_adapter(two_tenants[0], "training",
                           offline={"concordance": 0.5})   # the rest not there yet
    web, _ = sign_in("viewer")
    html = web.get(f"/adapters/{adapter.id}").get_data(as_text=True)
    offline = html.split('id="offline"', 1)[1].split("</section>", 1)[0]
    assert "50.0%" in offline and offline.count("—") == 5
    assert "No training progress reported" in html and "No evaluated samples yet" in html
    assert "loss-chart" not in html and "plotly.js" not in html


def test_buttons_are_the_events_the_viewer_may_send(app, make_adapter, sign_in, two_tenants):
    acme = two_tenants[0]
    awaiting = make_adapter(acme, "awaiting_approval")
    canary = make_adapter(acme, "canary")
    approver_web, _ = sign_in("approver")
    html = approver_web.get(f"/adapters/{awaiting.id}").get_data(as_text=True)
    assert re.findall(r'data-event="(\w+)"', html.split('id="actions"')[1].split("</section>")[0]) \
        == ["approve", "reject"]
    assert 'placeholder="Comment (required)" required' in html
    html = approver_web.get(f"/adapters/{canary.id}").get_data(as_text=True)
    assert ">Next canary step<" in html and ">Promote<" in html and ">Roll back<" in html
    ops_web, _ = sign_in("ops")
    html = ops_web.get(f"/adapters/{canary.id}").get_data(as_text=True)
    assert ">Roll back<" in html and ">Promote<" not in html and ">Next canary step<" not in html
    assert 'id="actions"' not in ops_web.get(f"/adapters/{awaiting.id}").get_data(as_text=True)


def test_approving_moves_to_canary_queues_the_hot_load_and_shows_on_the_timeline(
        app, make_adapter, sign_in, two_tenants, redis_client):
    adapter = make_adapter(two_tenants[0], "awaiting_approval")
    web, approver = sign_in("approver")
    page = f"/adapters/{adapter.id}"
    resp = submit(web, page, {"comment": "beats the base model by 50 points"},
                  action=f"{page}/approve")
    assert resp.status_code == 302 and resp.headers["Location"].endswith(page)
    html = web.get(page).get_data(as_text=True)
    assert "is now canary at 5%" in html and "5% of traffic" in html
    timeline = html.split('id="timeline"', 1)[1]
    assert approver.email in timeline and "beats the base model by 50 points" in timeline
    assert "awaiting approval → canary (5%)" in timeline
    assert ("adapters.load", f"[{adapter.id}]") in queued_lora(redis_client)


def test_refusals_are_flashed_and_change_nothing(app, make_adapter, sign_in, two_tenants):
    adapter = make_adapter(two_tenants[0], "awaiting_approval")
    web, _ = sign_in("approver")
    page = f"/adapters/{adapter.id}"
    resp = submit(web, page, {"comment": "  "}, action=f"{page}/approve")
    assert resp.status_code == 302
    html = web.get(page).get_data(as_text=True)
    assert "comment: an approval needs a comment" in html
    resp = submit(web, page, {"comment": "ship it"}, action=f"{page}/promote")
    assert resp.status_code == 302
    assert "cannot promote an adapter that is awaiting approval" in web.get(page).get_data(
        as_text=True)
    assert reload(adapter.id).state == "awaiting_approval"
    assert db.session.scalar(db.select(db.func.count()).select_from(AdapterEvent)) == 0
    assert submit(web, page, {}, action=f"{page}/supersede").status_code == 404
    assert submit(web, page, {}, action=f"{page}/bogus").status_code == 404


def test_buttons_need_csrf(app, make_adapter, sign_in, two_tenants):
    adapter = make_adapter(two_tenants[0], "awaiting_approval")
    web, _ = sign_in("approver")
    assert web.post(f"/adapters/{adapter.id}/approve",
                    data={"comment": "ok"}).status_code == 400
    assert reload(adapter.id).state == "awaiting_approval"


def test_train_form_only_for_trainers(app, sign_in, two_tenants):
    for role in ("viewer", "approver", "finops"):
        web, _ = sign_in(role)
        assert 'id="train-form"' not in web.get("/adapters").get_data(as_text=True), role
    web, _ = sign_in("ops", tenant=two_tenants[0])
    form = web.get("/adapters").get_data(as_text=True).split('id="train-form"', 1)[1]
    assert "acme" in form and "globex" not in form


def test_train_form_queues_a_training_by_workflow_name(app, trainable, sign_in):
    tenant, sent = trainable
    web, ops = sign_in("ops")
    html = web.get("/adapters").get_data(as_text=True)
    resp = web.post("/adapters/train", data={"tenant_id": tenant.id, "workflow": "invoices",
                                             "csrf_token": csrf_from(html)})
    assert resp.status_code == 302
    page = web.get(resp.headers["Location"]).get_data(as_text=True)
    assert "queued" in page and ">training<" in page and "Invoices" in page
    assert TRAIN_WORKFLOW in page and "Cancel training" in page
    assert [name for name, _ in sent] == ["adapters.train"]


def test_train_form_says_why_it_could_not_train(app, trainable, sign_in):
    tenant, sent = trainable
    web, _ = sign_in("ops")
    resp = submit(web, "/adapters", {"tenant_id": tenant.id, "workflow": "no-such-workflow"},
                  action="/adapters/train")
    assert resp.status_code == 302 and resp.headers["Location"].endswith("/adapters")
    # a text that is neither a workflow's name nor its signature is named as unknown (it
    # read "not enough traces to train on: 0 usable traces" before)
    assert "has no workflow &#39;no-such-workflow&#39;" in \
        web.get("/adapters").get_data(as_text=True)
    assert sent == []


@pytest.mark.parametrize("role", ["viewer", "approver"])
def test_train_post_is_refused_for_non_trainers(app, trainable, sign_in, role):
    tenant, sent = trainable
    web, _ = sign_in(role)
    resp = submit(web, "/adapters", {"tenant_id": tenant.id, "workflow": TRAIN_WORKFLOW},
                  action="/adapters/train")
    assert resp.status_code == 403 and sent == []


def test_cancel_stops_a_training(app, make_adapter, sign_in, two_tenants):
    adapter = make_adapter(two_tenants[0], "training", requester=UserFactory(role="ops"))
    web, _ = sign_in("ops")
    page = f"/adapters/{adapter.id}"
    submit(web, page, {"comment": "wrong workflow"}, action=f"{page}/cancel")
    assert reload(adapter.id).state == "cancelled"
    assert ">cancelled<" in web.get(page).get_data(as_text=True)


def test_retrain_button_trains_a_new_adapter_on_the_current_traces(app, trainable, sign_in):
    """A shadow adapter's page says how many usable traces there are beyond its dataset;
    its trainer's "Retrain on current traces" retires it and opens the new adapter."""
    from app.adapters.models import AdapterTrace
    tenant, sent = trainable
    web, _ = sign_in("ops")
    resp = submit(web, "/adapters", {"tenant_id": tenant.id, "workflow": "invoices"},
                  action="/adapters/train")
    held = reload(int(resp.headers["Location"].rsplit("/", 1)[1]))
    held.state = "shadow"
    db.session.add_all([AdapterTrace(
        request_id=f"req_view_{tenant.id}_{i:03d}", tenant_id=tenant.id, workflow=TRAIN_WORKFLOW,
        tier="tier-3", answer=json.dumps({"invoice": 200 + i}),
        messages=[{"role": "user", "content": f"invoice {200 + i}"}]) for i in range(5)])
    db.session.commit()
    page = f"/adapters/{held.id}"
    html = web.get(page).get_data(as_text=True)
    assert re.search(r'id="usable-now">45 <span[^>]*>\(5 more than its dataset', html)
    assert ">Retrain on current traces<" in html
    viewer_web, _ = sign_in("approver")
    assert ">Retrain on current traces<" not in viewer_web.get(page).get_data(as_text=True)
    resp = submit(web, page, {"comment": "held back at 85%"}, action=f"{page}/retrain")
    assert resp.status_code == 302 and not resp.headers["Location"].endswith(page)
    new_page = web.get(resp.headers["Location"]).get_data(as_text=True)
    assert "queued on the workflow&#39;s current traces" in new_page
    assert f'id="retrain-of">#{held.id} {held.name}<' in new_page
    assert reload(held.id).state == "retired"
    assert [name for name, _ in sent] == ["adapters.train", "adapters.train", "adapters.unload"]


def test_detail_shows_the_served_form_and_when_the_policy_has_moved_on(
        app, make_adapter, sign_in, two_tenants):
    from app.contract.policy import form_of
    from app.policies.service import effective_policy
    tenant = two_tenants[0]
    now = effective_policy(tenant.id)
    web, _ = sign_in("viewer")
    same = make_adapter(tenant, "promoted", form=form_of(now))
    html = web.get(f"/adapters/{same.id}").get_data(as_text=True)
    cell = html.split('id="served-form"', 1)[1].split("</td>", 1)[0]
    assert ("minified keys" if now["minify_enabled"] else "full keys") in cell
    assert "served-form-note" not in cell
    moved = make_adapter(tenant, "canary", canary_pct=10,
                         form={**form_of(now), "minify_enabled": not now["minify_enabled"]})
    cell = web.get(f"/adapters/{moved.id}").get_data(as_text=True).split(
        'id="served-form"', 1)[1].split("</td>", 1)[0]
    assert "served-form-note" in cell and "minify_enabled" in cell and "Retrain" in cell
    legacy = make_adapter(tenant, "training")
    assert "not recorded" in web.get(f"/adapters/{legacy.id}").get_data(as_text=True)
