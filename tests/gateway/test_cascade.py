"""S01 cascade router and S04 logprob-margin escalation (issue 8), through the running
gateway: real fake upstreams, router params published to Redis the way the control
plane publishes them, the ledger read back from PostgreSQL."""
from __future__ import annotations

import asyncio
import json
import math
import types
from decimal import Decimal

import httpx
import numpy as np
import pytest

from app.core.pricing import request_cost
from app.core.router_features import feature_dim
from app.gateway.context import RequestContext
from app.gateway.stages import s01_route
from app.contract.routers import PublishedRouters
from tests.gateway.conftest import Server, health, make_world, wait_for
from tests.gateway.test_pipeline import snap

TIER2_PRICES = {"price_input_per_m": "0.35", "price_cached_input_per_m": "0.0875",
                "price_output_per_m": "1.05"}


def router_params(q1: float, q2: float, dim: int | None = None) -> dict:
    """A router that scores every request q1 for tier 1 and q2 for tier 2."""
    dim = feature_dim() if dim is None else dim

    def tier(rank: int, q: float) -> dict:
        return {"rank": rank, "coef": [0.0] * dim, "intercept": math.log(q / (1 - q)),
                "calibration": {"kind": "none"}}
    return {"format": "sluice-router/1", "feature_dim": dim, "fallback_rank": 3,
            "tiers": [tier(1, q1), tier(2, q2)]}


# ---- S01 on plain data ---------------------------------------------------------------

def routed_ctx(params: dict | None, workflow_age_h: float = 100, **policy) -> RequestContext:
    from datetime import datetime, timedelta, timezone
    s = snap(frontier_first_hours=48, **policy)
    routers = PublishedRouters()
    if params is not None:
        routers.update("tenant:1", json.dumps({"version": 1, "params": params}))
    ctx = RequestContext(request_id="r", snapshot=s, tenant=s.tenant(1), key={},
                         body={"model": "auto", "messages": [{"role": "user", "content": "q"}]},
                         services=types.SimpleNamespace(routers=routers),
                         workflow={"first_seen_at": (datetime.now(timezone.utc) - timedelta(
                             hours=workflow_age_h)).isoformat()})
    return ctx


def route(ctx: RequestContext) -> str:
    nxt = asyncio.run(s01_route.run(ctx))
    if nxt == "S01_DEFAULT_TIER2":
        asyncio.run(s01_route.default_tier2(ctx))
    return ctx.tier["name"]


@pytest.mark.parametrize("q1,q2,tier", [(0.9, 0.9, "tier-1"), (0.75, 0.9, "tier-2"),
                                        (0.5, 0.5, "tier-3")])
def test_router_picks_the_cheapest_tier_that_reaches_its_tau(q1, q2, tier):
    ctx = routed_ctx(router_params(q1, q2))
    ctx.embedding = np.zeros(384, dtype=np.float32)  # as S00 left it
    assert route(ctx) == tier  # policy defaults: τ1 = 0.80, τ2 = 0.70
    assert ctx.telemetry["route_reason"] == "router"
    assert ctx.router_score == pytest.approx(1 - q1, abs=1e-4)
    assert len(ctx.router_features) == feature_dim()


def test_no_router_or_a_broken_one_is_tier2_and_still_logs_a_trace():
    ctx = routed_ctx(None)
    assert route(ctx) == "tier-2" and ctx.telemetry["route_reason"] == "no_router"
    # the first router of a scope learns from exactly these requests: features are logged
    assert ctx.embedding is not None and len(ctx.router_features) == feature_dim()
    assert ctx.router_score is None
    ctx = routed_ctx(router_params(0.9, 0.9, dim=4))  # loads, cannot score a real request
    ctx.embedding = np.zeros(384, dtype=np.float32)
    assert route(ctx) == "tier-2" and ctx.telemetry["route_reason"] == "router_error"
    assert len(ctx.router_features) == feature_dim()
    young = routed_ctx(router_params(0.9, 0.9), workflow_age_h=1)
    young.embedding = np.ones(384, dtype=np.float32)  # S00's embedding is reused, not remade
    assert route(young) == "tier-3" and young.telemetry["route_reason"] == "frontier_first"
    assert np.array_equal(young.router_features[:384], young.embedding)


def test_frontier_until_router_keeps_a_scope_without_router_on_the_frontier():
    """Policy frontier_until_router: no auto request reaches a cheaper tier before a router
    version is promoted; once one is, the router decides as usual."""
    ctx = routed_ctx(None, frontier_until_router=True)
    assert route(ctx) == "tier-3"
    assert ctx.telemetry["route_reason"] == "frontier_until_router"
    assert len(ctx.router_features) == feature_dim()   # still a training trace
    ctx = routed_ctx(router_params(0.9, 0.9), frontier_until_router=True)
    ctx.embedding = np.zeros(384, dtype=np.float32)
    assert route(ctx) == "tier-1" and ctx.telemetry["route_reason"] == "router"
    # a tenant may turn it on (stricter) but not off where it is on centrally
    from app.contract.policy import FIELDS, TENANT_UP
    assert FIELDS["frontier_until_router"].tenant == TENANT_UP
    assert FIELDS["frontier_until_router"].default is False   # the seed's S01_DEFAULT_TIER2


def test_frontier_until_router_asks_only_the_workflows_own_router():
    """Under frontier_until_router a workflow's request leaves the frontier only by its own
    router: the tenant's (trained on the other workflows' labels) is not asked for it, and
    it still routes requests that name no workflow."""
    ctx = routed_ctx(router_params(0.9, 0.9), frontier_until_router=True)   # tenant:1 router
    ctx.workflow_signature = "wf-sql"
    ctx.embedding = np.zeros(384, dtype=np.float32)
    assert route(ctx) == "tier-3" and ctx.telemetry["route_reason"] == "frontier_until_router"
    own = routed_ctx(router_params(0.9, 0.9), frontier_until_router=True)
    own.services.routers.update("tenant:1:wf:wf-sql",
                                json.dumps({"version": 1, "params": router_params(0.9, 0.9),
                                            "taus": {"1": 0.5, "2": 0.5}}))
    own.workflow_signature = "wf-sql"
    own.embedding = np.zeros(384, dtype=np.float32)
    assert route(own) == "tier-1" and own.telemetry["route_reason"] == "router"
    assert s01_route.taus(own) == {1: 0.5, 2: 0.5}   # the workflow version's own τ
    # the policy off: the tenant's router decides for a workflow with none of its own
    off = routed_ctx(router_params(0.9, 0.9))
    off.workflow_signature = "wf-sql"
    off.embedding = np.zeros(384, dtype=np.float32)
    assert route(off) == "tier-1" and off.telemetry["route_reason"] == "router"


def test_explicit_tier_logs_features_only_when_s00_embedded():
    for embedded in (False, True):
        ctx = routed_ctx(None)
        ctx.requested_tier = min(ctx.snapshot.all_tiers, key=lambda t: t["rank"])
        if embedded:
            ctx.embedding = np.zeros(384, dtype=np.float32)
        assert route(ctx) == "tier-1" and ctx.telemetry["route_reason"] == "explicit"
        assert (ctx.router_features is not None) is embedded
        assert ctx.embedding is None or embedded  # never embedded for the trace alone


def test_a_failing_trace_embedding_never_changes_the_route():
    ctx = routed_ctx(None, workflow_age_h=1)
    ctx.embedding = "not a vector"  # S00 left something features cannot be made from
    assert route(ctx) == "tier-3" and ctx.telemetry["route_reason"] == "frontier_first"
    assert ctx.router_features is None and ctx.telemetry["router_features_error"]


# ---- through the gateway ---------------------------------------------------------------

@pytest.fixture(scope="module")
def unsure(tmp_path_factory):
    s = Server("fake", "unsure-t1", log_dir=tmp_path_factory.mktemp("logs"))
    yield s
    s.stop()


def msgs(text: str) -> list[dict]:
    return [{"role": "system", "content": "cascade suite"}, {"role": "user", "content": text}]


def publish_router(w, params: dict) -> None:
    from app.extensions import db
    from app.cascade import service
    from app.cascade.models import RouterModel
    scope = f"tenant:{w.tenant.id}"
    old = service.active_model(scope)
    if old is not None:
        old.status = "retired"
    version = len(service.versions(scope)) + 1
    db.session.add(RouterModel(scope=scope, version=version, status="active", params=params))
    db.session.commit()
    published = service.publish_active(scope)
    assert published is not None
    wait_for(lambda: (health(w.gateway).get("router_version") or 0) >= published,
             what="router reload")


def known_workflow(w, text: str = "warm up") -> None:
    """One request so the workflow exists (frontier-first ends at frontier_first_hours=0)."""
    from app.redis_client import get_redis, keys
    # count from what the gateway has written by now, not from the world's start: after
    # earlier traffic "1 event" is already true, and the drain could run before this
    # request's event is on the stream (then nothing published the workflow)
    before = health(w.gateway)["ledger_written"]
    first = w.client().chat.completions.with_raw_response.create(model="auto", messages=msgs(text))
    assert first.headers["x-sluice-tier"] == "tier-3"
    w.drain_rows(before - w.written_before + 1)   # creates the workflow, publishes a snapshot
    # wait for that snapshot, not for any reload: the gateway may still be loading one an
    # earlier drain published, without the workflow (then auto went to the frontier again)
    stored = int(get_redis().get(keys().snapshot_version()))
    wait_for(lambda: health(w.gateway)["snapshot_version"] >= stored, what="snapshot reload")


def last_body(server: Server) -> dict:
    return httpx.get(server.url + "/stats", timeout=5).json()["last_body"]


def test_low_margin_tier1_escalates_and_only_tier2_reaches_the_client(
        app, gateway, unsure, fake_replicas, frontier):
    w = make_world(app, gateway, [unsure.url], frontier.url, tier2_urls=[fake_replicas[0].url],
                   policy={"frontier_first_hours": 0, "margin_window_tokens": 2})
    known_workflow(w)
    publish_router(w, router_params(0.95, 0.95))  # the router sends everything to tier 1
    client = w.client()
    text = "one two three four five six seven"

    stream = client.chat.completions.with_raw_response.create(
        model="auto", stream=True, messages=msgs(text))
    assert stream.headers["x-sluice-tier"] == "tier-2"
    chunks = list(stream.parse())
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == f"Echo: {text}"  # no "Unsure:" byte from the aborted tier 1
    assert all(c.choices[0].logprobs is None for c in chunks if c.choices)
    assert last_body(unsure)["logprobs"] is True and last_body(unsure)["top_logprobs"] == 2

    other = "eight nine ten eleven twelve"  # not the streamed prompt: no cache hit
    plain = client.chat.completions.with_raw_response.create(model="auto", messages=msgs(other))
    assert plain.headers["x-sluice-tier"] == "tier-2"
    answer = plain.parse().choices[0]
    assert answer.message.content == f"Echo: {other}" and answer.logprobs is None

    rows = w.drain_rows(3)[-2:]
    for row in rows:
        assert row.escalated and row.tier == "tier-2" and row.status == 200
        (aborted,) = row.payload["attempts"]
        assert (aborted["tier"], aborted["reason"]) == ("tier-1", "low_margin")
        served = request_cost(TIER2_PRICES, row.prompt_tokens, row.cached_tokens,
                              row.completion_tokens)
        assert Decimal(aborted["cost_usd"]) > 0
        assert row.cost_usd == Decimal(aborted["cost_usd"]) + served  # both attempts paid
        d = row.payload["caching_and_routing_decision"]
        assert d["cascade_fallback_triggered"] is True and d["assigned_compute_tier"] == "tier-2"
        assert aborted["margin"] == pytest.approx(0.3, abs=1e-3)  # below γ = 0.78
        assert d["logprob_margin_confidence"] == pytest.approx(2.95, abs=1e-3)  # tier 2's
        assert d["router_complexity_score"] == pytest.approx(0.05, abs=1e-3)
        assert row.payload["escalated_from"] == [1]


def test_high_margin_tier1_is_served_by_tier1(app, gateway, fake_replicas, frontier):
    w = make_world(app, gateway, [fake_replicas[0].url], frontier.url,
                   policy={"frontier_first_hours": 0})
    known_workflow(w)
    publish_router(w, router_params(0.95, 0.95))
    client = w.client()
    stream = client.chat.completions.with_raw_response.create(
        model="auto", stream=True, messages=msgs("sure thing"))
    assert stream.headers["x-sluice-tier"] == "tier-1"
    chunks = list(stream.parse())
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) \
        == "Echo: sure thing"
    assert all(c.choices[0].logprobs is None for c in chunks if c.choices)
    asked = client.chat.completions.create(model="auto", messages=msgs("with logprobs"),
                                           logprobs=True, top_logprobs=2)
    assert asked.choices[0].logprobs is not None  # the client asked: it keeps them
    rows = w.drain_rows(3)[-2:]
    for row in rows:
        assert not row.escalated and row.tier == "tier-1" and row.payload["attempts"] == []
        d = row.payload["caching_and_routing_decision"]
        assert d["logprob_margin_confidence"] == pytest.approx(2.95, abs=1e-3)
        assert d["route_reason"] == "router"
        assert len(row.payload["router_features"]) == feature_dim()


def test_router_failure_falls_back_to_tier2(app, gateway, fake_replicas, frontier):
    from app.redis_client import get_redis, keys
    from app.cascade import service
    w = make_world(app, gateway, [fake_replicas[0].url], frontier.url,
                   policy={"frontier_first_hours": 0, "cache_enabled": False})
    known_workflow(w)
    publish_router(w, router_params(0.95, 0.95))
    client = w.client()

    def tier(text: str) -> str:
        return client.chat.completions.with_raw_response.create(
            model="auto", messages=msgs(text)).headers["x-sluice-tier"]

    assert tier("while the router works") == "tier-1"
    r = get_redis()
    r.set(service.active_key(f"tenant:{w.tenant.id}"), b'{"params": corrupt')
    bumped = r.incr(keys().routers_version())
    wait_for(lambda: (health(w.gateway).get("router_version") or 0) >= bumped,
             what="router reload")
    assert tier("corrupt params") == "tier-2"
    publish_router(w, router_params(0.95, 0.95, dim=7))  # loads, but cannot score
    assert tier("wrong shape") == "tier-2"
    rows = w.drain_rows(4)[-3:]
    reasons = [r.payload["caching_and_routing_decision"]["route_reason"] for r in rows]
    assert reasons == ["router", "no_router", "router_error"]
    assert "S01_DEFAULT_TIER2" in rows[2].payload["pipeline"]["states"]
    assert "coef" in rows[2].payload["pipeline"]["router_error"] \
        or "feature" in rows[2].payload["pipeline"]["router_error"]


def test_tau_change_in_the_policy_takes_effect_without_restart(
        app, gateway, fake_replicas, frontier):
    from app.policies.service import update_policy
    from tests.factories import UserFactory
    w = make_world(app, gateway, [fake_replicas[0].url], frontier.url,
                   policy={"frontier_first_hours": 0, "cache_enabled": False})
    known_workflow(w)
    publish_router(w, router_params(0.75, 0.95))  # q1 = 0.75: below τ1 0.80, above 0.70
    client = w.client()

    def tier(text: str) -> str:
        return client.chat.completions.with_raw_response.create(
            model="auto", messages=msgs(text)).headers["x-sluice-tier"]

    assert tier("before") == "tier-2"
    admin = UserFactory(role="admin")
    version = health(w.gateway)["snapshot_version"]
    update_policy(admin, w.tenant.id, {"router_tau_1": 0.7})
    wait_for(lambda: health(w.gateway)["snapshot_version"] > version, what="snapshot reload")
    assert tier("after") == "tier-1"
    reloads = health(w.gateway)["reloads"]
    update_policy(admin, w.tenant.id, {"router_tau_1": 0.8})
    wait_for(lambda: health(w.gateway)["reloads"] > reloads, what="snapshot reload")
    assert tier("and back") == "tier-2"


def test_answer_shorter_than_the_window_is_judged_at_its_end(
        app, gateway, unsure, fake_replicas, frontier):
    w = make_world(app, gateway, [unsure.url], frontier.url, tier2_urls=[fake_replicas[0].url],
                   policy={"frontier_first_hours": 0, "cache_enabled": False})  # window 12
    known_workflow(w)
    publish_router(w, router_params(0.95, 0.95))
    body = {"model": "auto", "stream": True, "messages": msgs("short reply"),
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", w.base_url + "/chat/completions", json=body, timeout=30,
                      headers={"authorization": f"Bearer {w.key}"}) as r:
        assert r.status_code == 200 and r.headers["x-sluice-tier"] == "tier-2"
        raw = r.read()
    assert b"Unsure" not in raw and b'"logprobs":{' not in raw  # not one byte of tier 1
    assert b"Echo:" in raw and raw.endswith(b"data: [DONE]\n\n")
    (row,) = w.drain_rows(2)[-1:]
    (aborted,) = row.payload["attempts"]
    # the whole tier-1 stream was read, so its real usage is what was booked
    assert aborted["completion_tokens"] == 3 and "aborted_usage_estimated" not in \
        row.payload["pipeline"]
