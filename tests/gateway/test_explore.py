"""Tier-1 exploration for the router's labels (issue 24), through a running gateway: requests a
higher tier served are answered again by tier 1 off the path, judged against the served
answer, booked as kind ``shadow`` (never on the budget), and read back by the cascade's trace
reader as tier-1 labels: positives where tier 1 agreed, negatives where it did not.

Tier 1 is a fake "novice": it answers like the others on short prompts and starts "Unsure:"
on long ones (more than NOVICE_WORDS words), so a short prompt is one tier 1 gets right and a
long one is one it gets wrong. The shared test gateway runs with exploration off
(TestConfig); this module starts one with it on."""
from __future__ import annotations

from decimal import Decimal

import httpx
import orjson
import pytest

from app.contract import budget as rb
from app.core.costing import to_micro
from tests.gateway.conftest import (Server, make_world, off_path_gateway, publish_and_wait,
                                    wait_for)

WORKFLOW = "explored-workflow"
SHORT = ["total of invoice {i} please", "due date of invoice {i}", "supplier of invoice {i}"]
LONG = ("read the whole attached contract number {i} with its annexes and tell me which clause "
        "governs the early termination fee when the customer moved to another region and the "
        "guarantor defaulted first")


@pytest.fixture(scope="module")
def novice(tmp_path_factory):
    s = Server("fake", "novice-explore", log_dir=tmp_path_factory.mktemp("logs"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def explore_gateway(app_config, tmp_path_factory):
    s = off_path_gateway(app_config, tmp_path_factory, "explore", GATEWAY_EXPLORE_MAX_INFLIGHT=4)
    yield s
    s.stop()


@pytest.fixture()
def eworld(app, explore_gateway, novice, fake_replicas, frontier):
    return make_world(app, explore_gateway, [novice.url], frontier.url,
                      tier2_urls=[fake_replicas[0].url],
                      policy={"explore_pct": 100, "cache_enabled": False})


def ask(w, text: str, **extra) -> httpx.Response:
    r = httpx.post(w.base_url + "/chat/completions", timeout=30,
                   headers={"authorization": f"Bearer {w.key}", "x-sluice-workflow": WORKFLOW},
                   json={"model": "auto", "max_tokens": 40,
                         "messages": [{"role": "user", "content": text}], **extra})
    assert r.status_code == 200, r.text
    return r


def feedback(w, request_id: str, passed: bool) -> None:
    r = httpx.post(w.base_url + "/feedback", timeout=10,
                   headers={"authorization": f"Bearer {w.key}"},
                   json={"request_id": request_id, "verdict": "pass" if passed else "fail"})
    assert r.status_code == 202, r.text


def set_policy(w, values: dict) -> None:
    from app.policies.service import update_policy
    from tests.factories import UserFactory
    update_policy(UserFactory(role="admin"), w.tenant.id, values)
    publish_and_wait(w.gateway)   # a version at least as new as the policy's


_VARYING = {"x-sluice-request-id", "x-request-id", "date", "content-length"}


def comparable(r: httpx.Response) -> tuple[dict, dict]:
    body = {k: v for k, v in r.json().items() if k not in ("id", "created")}
    return body, {k: v for k, v in r.headers.items() if k not in _VARYING}


def spent(redis_client, app, tenant_id) -> int:
    return rb.state(redis_client, app.config["REDIS_NAMESPACE"], tenant_id)["spent_micro"]


def test_exploration_gives_tier_one_labels_off_the_path_and_off_the_budget(
        app, eworld, novice, redis_client, monkeypatch):
    from app.cascade import evaluation as ev
    from app.cascade.traces import traces_from_ledger
    from app.finops.service import ledger_month_spend
    w = eworld
    # a new workflow: frontier-first, every request logs S01's features (a trace)
    short = [ask(w, SHORT[i % 3].format(i=i)) for i in range(3)]
    long = [ask(w, LONG.format(i=i)) for i in range(2)]
    assert all(r.headers["x-sluice-tier"] == "tier-3" for r in short + long)
    rid = {r.headers["x-sluice-request-id"]: r for r in short + long}
    short_ids = [r.headers["x-sluice-request-id"] for r in short]
    long_ids = [r.headers["x-sluice-request-id"] for r in long]

    rows = w.drain_rows(10)   # five requests, five exploration runs
    requests = {r.request_id: r for r in rows if r.kind == "request"}
    explored = {r.request_id: r for r in rows if r.kind == "shadow"}
    assert set(requests) == set(rid)
    assert set(explored) == {f"{i}-explore" for i in rid}
    for i in rid:
        row = explored[f"{i}-explore"]
        assert row.tier == "tier-1" and row.model == "tiny-served" and row.adapter == ""
        assert row.baseline_cost_usd == 0 and row.workflow == requests[i].workflow
        p = row.payload
        assert (p["explore"], p["tier_rank"], p["shadow_of"], p["served_tier"]) == (
            True, 1, i, "tier-3")
        assert p["agreed"] is (i in short_ids)
        # priced at tier 1 ($0.06 in, $0.015 cached, $0.18 out per 1M)
        uncached = row.prompt_tokens - row.cached_tokens
        assert row.cost_usd == (uncached * Decimal("0.06") + row.cached_tokens * Decimal("0.015")
                                + row.completion_tokens * Decimal("0.18")) / 1_000_000 > 0
    # tier 1 got the client's request, not streamed, asked for its base model
    sent = httpx.get(novice.url + "/stats").json()["last_body"]
    assert sent["model"] == "tiny-served" and sent["stream"] is False
    assert sent["max_tokens"] == 40

    # the budget holds what the client paid, never the exploration runs
    paid = sum(to_micro(r.cost_usd) for r in requests.values())
    wait_for(lambda: spent(redis_client, app, w.tenant.id) == paid, what="settles")
    assert ledger_month_spend(rb.current_period())[w.tenant.id] == sum(
        r.cost_usd for r in requests.values())

    # the cascade reads them as tier-1 labels of the requests they shadowed
    scope = f"tenant:{w.tenant.id}:wf:{requests[short_ids[0]].workflow}"
    traces = {t["request_id"]: t for t in traces_from_ledger(scope)}
    assert set(traces) == set(rid)
    labels = {i: ev.tier_labels(t) for i, t in traces.items()}
    for i in short_ids:
        assert traces[i]["shadow"] == {"1": True} and labels[i] == [1, None, None]
    for i in long_ids:
        assert traces[i]["shadow"] == {"1": False} and labels[i] == [0, None, None]

    # the client's verdict on the served answer decides what agreeing with it means
    feedback(w, short_ids[0], passed=False)   # tier 1 agreed with a failing answer: fails
    feedback(w, short_ids[1], passed=True)
    feedback(w, long_ids[0], passed=True)     # tier 1 disagreed with a passing one: fails
    feedback(w, long_ids[1], passed=False)
    w.drain_rows(10)
    traces = {t["request_id"]: t for t in traces_from_ledger(scope)}
    assert ev.tier_labels(traces[short_ids[0]]) == [0, 0, 0]
    assert ev.tier_labels(traces[short_ids[1]]) == [1, None, 1]
    assert ev.tier_labels(traces[long_ids[0]]) == [0, None, 1]
    assert ev.tier_labels(traces[long_ids[1]]) == [0, 0, 0]

    # the training scheduler counts them: tier 1 has a label for every request (without
    # exploration it would have two, both failures)
    from app.cascade.schedule import due_scopes
    monkeypatch.setitem(app.config, "ROUTER_MIN_LABELS", 1)
    due = {d["scope"]: d for d in due_scopes()}
    assert due[scope]["tiers"] == {"1": len(rid), "2": 2}


def test_exploration_never_changes_the_answer_and_follows_the_policy(app, eworld, novice):
    from app.cascade.traces import traces_from_ledger
    w = eworld
    question = SHORT[0].format(i=7)
    explored = ask(w, question)
    w.drain_rows(2)
    set_policy(w, {"explore_pct": 0})
    plain = ask(w, question)
    assert comparable(explored) == comparable(plain)   # same answer, same headers

    # tier 2 (frontier-first over, no router yet); a stream is explored from what it relayed
    set_policy(w, {"explore_pct": 100, "frontier_first_hours": 0})
    streamed = httpx.post(w.base_url + "/chat/completions", timeout=30,
                          headers={"authorization": f"Bearer {w.key}",
                                   "x-sluice-workflow": WORKFLOW},
                          json={"model": "auto", "max_tokens": 40, "stream": True,
                                "messages": [{"role": "user", "content": SHORT[1].format(i=8)}]})
    assert streamed.status_code == 200 and "[DONE]" in streamed.text
    assert streamed.headers["x-sluice-tier"] == "tier-2"
    hard = ask(w, LONG.format(i=9))
    assert hard.headers["x-sluice-tier"] == "tier-2"
    # a tenant that may not use tier 1 has nothing to learn about it
    set_policy(w, {"allowed_tiers": ["tier-2", "tier-3"]})
    fenced = ask(w, SHORT[2].format(i=10))
    set_policy(w, {"allowed_tiers": []})
    # requests tier 1 served, or that logged no features (explicit tier, no S00 embedding),
    # have nothing to explore
    served_by_one = httpx.post(w.base_url + "/chat/completions", timeout=30,
                               headers={"authorization": f"Bearer {w.key}",
                                        "x-sluice-workflow": WORKFLOW},
                               json={"model": "tier-1", "max_tokens": 40,
                                     "messages": [{"role": "user", "content": "short one"}]})
    assert served_by_one.status_code == 200
    named = httpx.post(w.base_url + "/chat/completions", timeout=30,
                       headers={"authorization": f"Bearer {w.key}", "x-sluice-workflow": WORKFLOW},
                       json={"model": "tier-3", "max_tokens": 40,
                             "messages": [{"role": "user", "content": "named tier"}]})
    assert named.status_code == 200

    ids = {name: r.headers["x-sluice-request-id"] for name, r in (
        ("explored", explored), ("plain", plain), ("streamed", streamed), ("hard", hard),
        ("fenced", fenced), ("tier1", served_by_one), ("named", named))}
    rows = w.drain_rows(7 + 3)   # seven requests; explored, streamed and hard were explored
    shadow_of = {r.payload["shadow_of"]: r for r in rows if r.kind == "shadow"}
    assert set(shadow_of) == {ids["explored"], ids["streamed"], ids["hard"]}
    assert shadow_of[ids["streamed"]].payload["agreed"] is True
    assert shadow_of[ids["hard"]].payload["agreed"] is False
    assert shadow_of[ids["hard"]].payload["served_tier"] == "tier-2"
    workflow = rows[0].workflow
    traces = {t["request_id"]: t for t in traces_from_ledger(f"tenant:{w.tenant.id}:wf:{workflow}")}
    assert traces[ids["hard"]]["shadow"] == {"1": False}
    assert traces[ids["plain"]]["shadow"] is None


SCHEMA = {"type": "object", "properties": {"customer_full_name": {"type": "string"},
                                           "invoice_total_amount": {"type": "number"}},
          "required": ["customer_full_name", "invoice_total_amount"],
          "additionalProperties": False}
FMT = {"type": "json_schema", "json_schema": {"name": "inv", "schema": SCHEMA}}


def test_exploration_sends_tier_one_what_the_routed_path_would(app, eworld, novice, frontier):
    """The probe asks tier 1 with S02's minified schema (and, on a pool, the compact grammar
    where the policy wants it), as a routed request would reach tier 1, and expands the
    answer's keys before judging it: a client body with full keys would ask a small model
    for a longer answer than routing ever does."""
    w = eworld
    set_policy(w, {"minify_compact_json": False})
    r = ask(w, "invoice of Ada Lovelace for 12 EUR [[json:1]]", response_format=FMT)
    assert r.headers["x-sluice-tier"] == "tier-3"
    assert orjson.loads(r.json()["choices"][0]["message"]["content"]) == {
        "customer_full_name": "v0", "invoice_total_amount": 2}
    rid = r.headers["x-sluice-request-id"]
    rows = {x.request_id: x for x in w.drain_rows(2)}
    explored = rows[f"{rid}-explore"]
    assert explored.payload["agreed"] is True   # expanded: the aliased answer agrees
    sent = httpx.get(novice.url + "/stats").json()["last_body"]
    props = sent["response_format"]["json_schema"]["schema"]["properties"]
    assert len(props) == 2 and "customer_full_name" not in props   # the aliases went
    assert "structured_outputs" not in sent and sent["max_tokens"] == 40
    frontier_sent = httpx.get(frontier.url + "/stats").json()["last_body"]
    assert sent["messages"] == frontier_sent["messages"]   # the rewritten instructions too
    # an adapter of this workflow is trained on that same form (app.adapters.served_form)
    from app.adapters.served_form import pool_tokenizer, to_served
    from app.policies.service import effective_policy
    record = {"messages": [{"role": "user", "content": "invoice of Ada Lovelace for 12 EUR "
                                                       "[[json:1]]"}],
              "response_format": FMT, "answer": r.json()["choices"][0]["message"]["content"]}
    served = to_served(record, effective_policy(w.tenant.id), pool_tokenizer(w.pool))
    assert served["response_format"] == sent["response_format"]
    assert served["messages"] == sent["messages"]
    assert list(orjson.loads(served["answer"])) == list(props)

    # compact on: the frontier (external) still gets response_format, tier 1 (a pool) the
    # grammar with the style hint, as S02 gives a routed pool request
    set_policy(w, {"minify_compact_json": True})
    r = ask(w, "invoice of Grace Hopper for 7 EUR [[json:1]]", response_format=FMT)
    rid = r.headers["x-sluice-request-id"]
    rows = {x.request_id: x for x in w.drain_rows(4)}
    assert rows[f"{rid}-explore"].payload["agreed"] is False   # the fake echoes a grammar
    sent = httpx.get(novice.url + "/stats").json()["last_body"]
    frontier_sent = httpx.get(frontier.url + "/stats").json()["last_body"]
    assert "response_format" in frontier_sent and "structured_outputs" not in frontier_sent
    assert "response_format" not in sent and sent["structured_outputs"]["grammar"]
    assert sent["messages"] != frontier_sent["messages"]   # the style hint
    record = {"messages": [{"role": "user", "content": "invoice of Grace Hopper for 7 EUR "
                                                       "[[json:1]]"}],
              "response_format": FMT, "answer": r.json()["choices"][0]["message"]["content"]}
    served = to_served(record, effective_policy(w.tenant.id), pool_tokenizer(w.pool))
    assert served["messages"] == sent["messages"] and served["served_form"]["compact"]
    assert "customer_full_name" not in sent["structured_outputs"]["grammar"]
