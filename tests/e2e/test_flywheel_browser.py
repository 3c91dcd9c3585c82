"""The LoRA flywheel end to end, on CPU, with no mock of our own code: frontier answers of a
workflow through the real gateway become traces; the real Celery worker trains a LoRA on
SmolLM2 and evaluates it; the shadow run hot-loads it on a reference-engine replica that
the real pool worker started, and the gateway shadows live requests with it; the shadow
gate submits it; an approver (not the requester) approves it in headless Chromium, steps
the canary to promotion (tier-1 requests of the workflow are then served by the adapter)
and rolls it back (unloaded; the base model serves again).

Lowered for CPU (stated): the tenant's distill_min_traces (30) and shadow_concordance
(0.8), ADAPTERS_SHADOW_MIN_REQUESTS (5, the rollup runs in this process), the adapter's
shadow sample_pct (100%), and small hyperparameters (tests/e2e/flywheel.py)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.adapters import rollout, states
from app.adapters.serving import shadow_rollup
from app.contract import budget as rb
from app.core.concordance import text_match
from app.core.costing import to_micro
from app.errors import Forbidden
from app.extensions import db
from tests.console.web import browser as web_client, login
from tests.e2e.conftest import sign_in
from tests.e2e.flywheel import (SHADOW_MIN_REQUESTS, WORKFLOW, chat, content_of,
                                drain_traces_until, echo, engine_models, ledger_rows,
                                make_world, orders, reload, start_pool, stop_pool,
                                train_candidate, wait_for, wait_snapshot)
from tests.factories import UserFactory
from tests.pools.conftest import free_port_run

DOCS = Path(__file__).resolve().parents[2] / "docs"
N_TRACES = 40
N_SHADOWED = 6


def _click(page, event: str, comment: str = "") -> None:
    form = page.locator(f"#actions form[data-event='{event}']")
    if comment:
        form.locator("input[name=comment]").fill(comment)
    with page.expect_navigation():
        form.locator("button[type=submit]").click()


@pytest.mark.slow
@pytest.mark.timeout(900)   # a bound only: ~1.5 min on 2 idle cores, ~3.5 min when shared
def test_flywheel_traces_training_shadow_approval_canary_promotion_rollback(
        app, gateway, frontier, celery_worker, node_worker, own_files, console, page,
        monkeypatch, redis_client, tmp_path):
    ops = UserFactory(role="ops")
    world = make_world(app, gateway, frontier, free_port_run(1))
    pool = world.pool
    try:
        # 1. the tier-1 pool: a SmolLM2 reference engine with LoRA, started by the node worker
        rep = start_pool(ops, pool, node_worker)
        assert engine_models(rep.url) == ["smollm2-135m"]

        # 2. traces: frontier answers of the workflow, through the gateway, drained to SQL
        for order in orders(N_TRACES, seed=1):
            r = chat(world, order, "tier-3")
            assert r.headers["x-sluice-tier"] == "tier-3" and content_of(r) == echo(order)
        assert drain_traces_until(world.tenant.id, N_TRACES) == N_TRACES
        # the ledger drain (every 2 s under beat) books them and names the workflow
        assert {(r.kind, r.tier, r.workflow, r.adapter) for r in ledger_rows(world, N_TRACES)} \
            == {("request", "tier-3", WORKFLOW, "")}

        # 3. training: an ops user asks, the Celery worker trains and evaluates
        # a quarter held out (request-id hash): ~10 of 40, never an empty side in practice
        adapter, done = train_candidate(ops, world.tenant.id, WORKFLOW, celery_worker,
                                        own_files)
        off, name = done.offline, done.name
        assert off["n"] == done.dataset.n_heldout >= 1 and off["metric"] == "text_f1", off
        assert off["concordance"] >= off["base_concordance"] + 0.3, off

        # 4. shadow: hot-loaded on the replica, every eligible answer shadowed (stated)
        done.shadow = {"sample_pct": 100}
        db.session.commit()
        rollout.shadow(ops, adapter.id, "shadow it on live traffic")
        node_worker.wait_for(lambda: reload(adapter.id).loaded == {str(rep.id): "ok"}, 120,
                             "adapter.loaded to say ok")
        assert name in engine_models(rep.url)
        entry = wait_snapshot(world, lambda e: e and e.get("shadow") and
                              e["shadow"]["replicas_loaded"] == [rep.id],
                              "the snapshot's shadow entry")
        assert entry["name"] is None and entry["shadow"]["sample_pct"] == 100.0
        shadowed = orders(N_SHADOWED, seed=2)
        for order in shadowed:
            assert content_of(chat(world, order, "tier-3")) == echo(order)
        rows = ledger_rows(world, N_TRACES + 2 * N_SHADOWED)
        shadow_rows = [r for r in rows if r.kind == "shadow"]
        requests = [r for r in rows if r.kind == "request"]
        assert len(shadow_rows) == N_SHADOWED and len(requests) == N_TRACES + N_SHADOWED
        assert {(r.adapter, r.tier) for r in shadow_rows} == {(name, "tier-1")}
        assert all(r.cost_usd > 0 for r in shadow_rows)
        agreed = sum(bool(r.payload["agreed"]) for r in shadow_rows)
        monkeypatch.setitem(app.config, "ADAPTERS_SHADOW_MIN_REQUESTS", SHADOW_MIN_REQUESTS)
        (line,) = shadow_rollup()   # what the adapters.shadow_rollup task runs
        assert line["requests"] == N_SHADOWED and line["agreed"] == agreed
        assert line["submitted"], (line, [r.payload for r in shadow_rows])
        submitted = reload(adapter.id)
        assert submitted.state == states.AWAITING and submitted.shadow["concordance"] >= 0.8
        # the tenant's budget counter holds what the client paid, never the shadow runs
        paid = sum(to_micro(r.cost_usd) for r in requests)
        ns = app.config["REDIS_NAMESPACE"]
        wait_for(lambda: rb.state(redis_client, ns, world.tenant.id)["spent_micro"] == paid,
                 15, "the budget counter to settle at the requests' cost")

        # 5. four eyes: the requester (ops) is offered no Approve ...
        requester = web_client(app)
        login(requester, ops.email)
        html = requester.get(f"/adapters/{adapter.id}").get_data(as_text=True)
        assert 'id="state">awaiting approval' in html and 'data-event="approve"' not in html
        with pytest.raises(Forbidden):
            rollout.approve(ops, adapter.id, "my own work looks fine")
        db.session.rollback()
        # ... an approver approves in Chromium, from the evidence
        approver = UserFactory(role="approver")
        sign_in(page, console, approver.email)
        detail = f"{console}/adapters/{adapter.id}"
        page.goto(detail)
        assert page.inner_text("#state") == "awaiting approval"
        offline_text = page.inner_text("#offline")
        assert f"{off['concordance'] * 100:.1f}%" in offline_text
        assert f"{off['base_concordance'] * 100:.1f}%" in offline_text
        shadow_text = page.inner_text("#shadow")
        assert f"{submitted.shadow['concordance'] * 100:.1f}%" in shadow_text
        assert str(N_SHADOWED) in shadow_text
        _click(page, "approve", "offline and shadow evidence both clear the bar")
        assert page.inner_text("#state") == "canary"
        assert page.inner_text("#canary-pct") == "5% of traffic"

        # 6. canary steps to promotion, in the browser
        seen = [5]
        while page.inner_text("#state") != "promoted":
            assert len(seen) < 5, seen
            _click(page, "advance")
            seen.append(int(page.inner_text("#canary-pct").split("%")[0]))
        assert seen == [5, 25, 100], seen
        promoted = reload(adapter.id)
        assert promoted.state == states.PROMOTED and promoted.approved_by == approver.email
        wait_snapshot(world, lambda e: e and e.get("state") == "promoted"
                      and e["name"] == name and e["replicas_loaded"] == [rep.id],
                      "the snapshot to serve the promoted adapter")
        served = orders(3, seed=3)
        answers = [chat(world, order, "tier-1") for order in served]
        for order, r in zip(served, answers):
            assert r.headers["x-sluice-tier"] == "tier-1"
            # the adapter's answer (the base never starts one with "Echo:", step 8), agreeing
            # with the frontier's by the measure the shadow gate applies: the full suite once
            # read 'Echo: Order #Echo: 19 x ...' for '#H740: 19 x ...' (one greedy token of a
            # tiny CPU-trained adapter), which the gate itself counts as agreement. Runs differ:
            # the held-out split hashes each trace's request id (uuid4 per run), so each run
            # trains on another subset of the traces
            assert content_of(r).startswith("Echo:"), (order, content_of(r))
            assert text_match(echo(order), content_of(r))[1], (order, content_of(r))
        rows = ledger_rows(world, N_TRACES + 2 * N_SHADOWED + len(served))
        by_id = {r.request_id: r for r in rows}
        assert [(by_id[r.headers["x-sluice-request-id"]].tier,
                 by_id[r.headers["x-sluice-request-id"]].adapter) for r in answers] == \
            [("tier-1", name)] * len(served)

        # 7. the evidence page, promoted (docs/adapter-detail.png with SLUICE_SCREENSHOTS=docs)
        page.goto(detail)
        page.wait_for_selector("#loss-chart .main-svg", state="attached")
        page.wait_for_timeout(300)
        out = DOCS if os.environ.get("SLUICE_SCREENSHOTS") == "docs" else tmp_path
        out.mkdir(exist_ok=True)
        page.screenshot(path=str(out / "adapter-detail.png"), full_page=True)
        assert (out / "adapter-detail.png").stat().st_size > 20_000

        # 8. rollback, one click: unloaded everywhere, the base model serves again
        page.once("dialog", lambda d: d.accept())
        _click(page, "rollback", "rolling back to the base model")
        assert page.inner_text("#state") == "rolled back"
        node_worker.wait_for(lambda: reload(adapter.id).loaded == {}, 120,
                             "adapter.loaded to be emptied by the unload")
        assert engine_models(rep.url) == ["smollm2-135m"]
        wait_snapshot(world, lambda e: e is None, "the snapshot to drop the adapter")
        after = orders(2, seed=4)
        answers = [chat(world, order, "tier-1") for order in after]
        assert all(not content_of(r).startswith("Echo:") for r in answers), \
            [content_of(r) for r in answers]
        rows = ledger_rows(world, N_TRACES + 2 * N_SHADOWED + len(served) + len(after))
        by_id = {r.request_id: r for r in rows}
        assert [(by_id[r.headers["x-sluice-request-id"]].tier,
                 by_id[r.headers["x-sluice-request-id"]].adapter) for r in answers] == \
            [("tier-1", "")] * len(after)
        assert [e.event for e in reload(adapter.id).events] == [
            "request", "trained", "shadow", "submit", "approve", "advance", "promote",
            "rollback"]
    finally:
        db.session.rollback()
        stop_pool(ops, pool, node_worker)
