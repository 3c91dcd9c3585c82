"""The router learns from real traffic (issue 8): ``model=auto`` requests through the running
gateway, the client's POST /v1/feedback, the ledger drain, then traces read back from
PostgreSQL and a router version trained on them."""
from __future__ import annotations

import random

import httpx
import numpy as np
import pytest

from app.core import router_model as rm
from app.core.router_features import feature_dim
from app.cascade import drill
from app.cascade import evaluation as ev
from app.cascade.training import uncalibrated
from tests.gateway.conftest import make_world, publish_and_wait

SYSTEM = "Invoice desk: answer with the invoice fields."


def easy(i: int) -> str:
    return f"Invoice INV-{1000 + i} from Lyon, total {10 + i} EUR."


def ask(w, text: str, **body) -> httpx.Response:
    r = httpx.post(w.base_url + "/chat/completions", timeout=30,
                   headers={"authorization": f"Bearer {w.key}",
                            "x-sluice-workflow": "invoice-desk"},
                   json={"model": "auto", "messages": [{"role": "system", "content": SYSTEM},
                                                       {"role": "user", "content": text}],
                         **body})
    assert r.status_code == 200, r.text
    return r


def feedback(w, request_id: str, passed: bool) -> None:
    r = httpx.post(w.base_url + "/feedback", timeout=10,
                   headers={"authorization": f"Bearer {w.key}"},
                   json={"request_id": request_id, "verdict": "pass" if passed else "fail"})
    assert r.status_code == 202, r.text


def traffic(w, prompts: list[tuple[str, bool]], tier: str) -> list[tuple[str, bool]]:
    """Send each prompt (distinct texts: no cache hits); returns (request id, easy)."""
    out = []
    for text, is_easy in prompts:
        r = ask(w, text)
        assert r.headers["x-sluice-tier"] == tier and r.headers["x-sluice-cache"] == "miss"
        out.append((r.headers["x-sluice-request-id"], is_easy))
    return out


@pytest.fixture()
def small_router_config(app, monkeypatch):
    """Thresholds sized for a few dozen requests (the service defaults want hundreds)."""
    monkeypatch.setitem(app.config, "ROUTER_MIN_LABELS", 12)
    monkeypatch.setitem(app.config, "ROUTER_MIN_HELDOUT", 1)
    monkeypatch.setitem(app.config, "ROUTER_RETRAIN_MIN_NEW_LABELS", 20)
    return app


def test_router_trains_from_gateway_traffic_and_client_feedback(
        small_router_config, gateway, fake_replicas, frontier, celery_worker):
    from app.policies.service import update_policy
    from app.cascade.traces import train_from_ledger, traces_from_ledger
    from tests.factories import UserFactory
    app = small_router_config
    w = make_world(app, gateway, [s.url for s in fake_replicas], frontier.url,
                   policy={"frontier_first_hours": 48})
    rng = random.Random(8)
    n = 12  # easy and hard prompts per phase

    def prompts(offset: int) -> list[tuple[str, bool]]:
        mix = [(easy(offset + i), True) for i in range(n)] + \
              [(drill.ood_prompt(rng) + f" (case {offset + i})", False) for i in range(n)]
        rng.shuffle(mix)
        return mix

    # phase 1: a new workflow runs frontier-first (cache on: S01 reuses S00's embedding)
    first = traffic(w, prompts(0), "tier-3")
    # phase 2: frontier-first over, no router published yet -> tier 2, cache off (S01 embeds)
    w.drain_rows(len(first))
    update_policy(UserFactory(role="admin"), w.tenant.id,
                  {"frontier_first_hours": 0, "cache_enabled": False})
    # a snapshot published after the policy's commit (the drain's own workflow publish can
    # land first and satisfy "a newer version" without the policy change)
    publish_and_wait(w.gateway)
    second = traffic(w, prompts(100), "tier-2")
    # two schema requests without feedback: S05's validation is their only label
    keys = ("supplier_invoice_reference_number", "total_amount_due_in_euros")
    schema = {"type": "json_schema", "json_schema": {"name": "inv", "schema": {
        "type": "object", "properties": {k: {"type": "string"} for k in keys},
        "required": list(keys)}}}
    schema_ids = [ask(w, easy(500 + i), response_format=schema).headers["x-sluice-request-id"]
                  for i in range(2)]
    w.wait_ledger(len(first) + len(second) + 2)
    for rid, is_easy in first + second:  # the client's validator: easy passes, hard fails
        feedback(w, rid, is_easy)
    rows = w.drain_rows(len(first) + len(second) + 2)
    workflows = {r.workflow for r in rows}
    assert len(workflows) == 1
    scope = f"tenant:{w.tenant.id}:wf:{workflows.pop()}"

    traces = {t["request_id"]: t for t in traces_from_ledger(scope)}
    assert len(traces) == len(first) + len(second) + 2
    assert all(len(t["features"]) == feature_dim() for t in traces.values())
    labels = {rid: ev.tier_labels(t) for rid, t in traces.items()}
    for rid, is_easy in first:  # served by the frontier
        assert labels[rid] == ([None, None, 1] if is_easy else [0, 0, 0])
    for rid, is_easy in second:  # served by tier 2
        assert labels[rid] == ([None, 1, 1] if is_easy else [0, 0, None])
    for rid in schema_ids:  # echo text is no JSON: schema invalid, a tier-2 fail
        assert traces[rid]["schema_valid"] is False and labels[rid][:2] == [0, 0]

    # the beat's scheduler finds the workflow (and its tenant) due and queues router.train;
    # the real worker runs it (with the default 200-label minimum it declines to train)
    from app.cascade.schedule import due_scopes, enqueue_due_training
    due = {d["scope"]: d for d in due_scopes()}
    assert set(due) == {scope, f"tenant:{w.tenant.id}"}
    assert due[scope]["tiers"] == {"1": 24 + 2, "2": 12 + 24 + 2} and due[scope]["new"] == 50
    assert set(enqueue_due_training()) == set(due)
    celery_worker.wait_for(lambda: f"'scope': '{scope}', 'traces': 50, 'trained': False"
                           in celery_worker.log(), what="router.train on the worker")
    celery_worker.wait_for(lambda: f"'scope': 'tenant:{w.tenant.id}', 'traces'"
                           in celery_worker.log(), what="router.train (tenant) on the worker")
    # queued once, not again while in flight: the worker declines these in milliseconds
    # and releases the mark, so hold the marks as an unfinished train would
    from app.redis_client import get_redis
    from app.cascade.schedule import _queued_key
    r = get_redis()
    for s in due:
        r.set(_queued_key(s), "1", ex=60)
    try:
        assert enqueue_due_training() == []
    finally:
        r.delete(*(_queued_key(s) for s in due))

    # what the router.train task runs, here with the small thresholds: a version
    out = train_from_ledger(scope)
    assert out["trained"] and out["version"] == 1, out
    from app.cascade.service import versions
    (model,) = versions(scope)
    assert model.trained_on > 0 and model.metrics["calibration"]
    # it learned the feedback: tier 2 scores the easy prompts above the hard ones
    X = np.asarray([traces[rid]["features"] for rid, _ in first + second])
    easy_rows = np.asarray([e for _, e in first + second])
    q2 = rm.predict_batch(rm.load(uncalibrated(model.params)), X)[:, 1]
    assert q2[easy_rows].min() > q2[~easy_rows].max()
    # trained on what it has: not due again until new labels arrive
    assert scope not in {d["scope"] for d in due_scopes()}
