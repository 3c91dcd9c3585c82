"""Shadow evaluation: the adapter in shadow answers a share of the requests a higher tier
served, after the client has its answer, booked as kind ``shadow`` and never on the
tenant's budget or FinOps totals; ``adapters.shadow_rollup`` turns the verdicts into the
adapter's concordance and submits it for approval when it meets the gate."""
from __future__ import annotations

import itertools
import time
from datetime import datetime, timezone
from decimal import Decimal

import httpx
import pytest
import sqlalchemy as sa

from app.adapters.models import Adapter, AdapterEvent
from app.catalog.models import Replica
from app.contract import budget as rb
from app.core.costing import to_micro
from app.extensions import db
from app.gateway.shadow import verdict
from app.ledger.models import LedgerEntry
from app.policies.models import Policy
from tests.factories import PoolFactory, TenantFactory
from tests.gateway.conftest import health, make_world, publish_and_wait, wait_for

WORKFLOW = "shadowed-workflow"
_n = itertools.count(1)


# --- the verdict (pure) -------------------------------------------------------------------

def test_verdict_compares_json_by_field_and_text_normalized():
    assert verdict('{"a": 1, "b": "x"}', '{"b":"x","a":1}', as_json=True)
    assert not verdict('{"a": 1, "b": "x"}', '{"a": 1, "b": "y"}', as_json=True)
    assert not verdict('{"a": 1}', '{"a": 1, "extra": 2}', as_json=True)
    assert not verdict('{"a": 1}', "not json", as_json=True)
    assert verdict("The answer is: Paris.", "answer is paris", as_json=False)
    assert not verdict("Paris", "London", as_json=False)


# --- through the gateway ------------------------------------------------------------------

@pytest.fixture()
def sworld(app, gateway, fake_replicas, frontier):
    # no S00 cache: the same request twice reaches the frontier twice
    return make_world(app, gateway, [s.url for s in fake_replicas], frontier.url,
                      policy={"cache_enabled": False})


def _shadow_adapter(w, loaded_ids, sample_pct=100, **cols) -> Adapter:
    a = Adapter(tenant_id=w.tenant.id, workflow=WORKFLOW, pool_id=w.pool.id,
                name=f"lora-sh{w.tenant.id}-{next(_n)}", state="shadow",
                artifact_path="/tmp/lora-sh", shadow={"sample_pct": sample_pct},
                loaded={str(i): "ok" for i in loaded_ids}, **cols)
    db.session.add(a)
    db.session.commit()
    publish_and_wait(w.gateway)
    return a


def _post(w, content: str, **extra) -> httpx.Response:
    r = httpx.post(w.base_url + "/chat/completions", timeout=30,
                   headers={"authorization": f"Bearer {w.key}", "x-sluice-workflow": WORKFLOW},
                   json={"model": "tier-3", "max_tokens": 12,
                         "messages": [{"role": "user", "content": content}], **extra})
    assert r.status_code == 200, r.text
    return r


_VARYING = {"x-sluice-request-id", "x-request-id", "date", "content-length"}


def _comparable(r: httpx.Response) -> tuple[dict, dict]:
    body = {k: v for k, v in r.json().items() if k not in ("id", "created")}
    return body, {k: v for k, v in r.headers.items() if k not in _VARYING}


def _spent(redis_client, app, tenant_id) -> int:
    return rb.state(redis_client, app.config["REDIS_NAMESPACE"], tenant_id)["spent_micro"]


def test_shadow_run_is_off_the_path_and_off_the_budget(app, sworld, fake_replicas,
                                                       redis_client):
    from app.finops import rollups
    from app.finops.models import Budget, Rollup
    from app.finops.service import ledger_month_spend, reconcile_budget_counters
    question = "classify this ticket please"
    plain = _post(sworld, question)
    adapter = _shadow_adapter(sworld, [r.id for r in sworld.pool.replicas])
    shadowed = _post(sworld, question)
    assert _comparable(shadowed) == _comparable(plain)   # same answer, same headers
    streamed = httpx.post(sworld.base_url + "/chat/completions", timeout=30,
                          headers={"authorization": f"Bearer {sworld.key}",
                                   "x-sluice-workflow": WORKFLOW},
                          json={"model": "tier-3", "max_tokens": 12, "stream": True,
                                "messages": [{"role": "user", "content": "stream it back"}]})
    assert streamed.status_code == 200 and "[DONE]" in streamed.text

    rows = sworld.drain_rows(5)   # three requests, two shadow runs
    requests = [r for r in rows if r.kind == "request"]
    shadows = {r.request_id: r for r in rows if r.kind == "shadow"}
    assert len(requests) == 3 and all(r.tier == "tier-3" and r.adapter == "" for r in requests)
    rid, srid = (shadowed.headers["x-sluice-request-id"],
                 streamed.headers["x-sluice-request-id"])
    assert set(shadows) == {f"{rid}-shadow", f"{srid}-shadow"}
    row = shadows[f"{rid}-shadow"]
    assert row.payload["shadow_of"] == rid and row.payload["adapter"] == adapter.name
    assert row.payload["agreed"] is True and shadows[f"{srid}-shadow"].payload["agreed"] is True
    assert row.adapter == adapter.name and row.tier == "tier-1"
    assert row.baseline_cost_usd == 0
    # priced at tier 1 ($0.06 in, $0.015 cached, $0.18 out per 1M)
    uncached = row.prompt_tokens - row.cached_tokens
    assert row.cost_usd == (uncached * Decimal("0.06") + row.cached_tokens * Decimal("0.015")
                            + row.completion_tokens * Decimal("0.18")) / 1_000_000 > 0
    # the adapter got the client's request: same limits, not streamed, no cache
    bodies = [httpx.get(s.url + "/stats").json()["last_body"] for s in fake_replicas]
    sent = next(b for b in bodies if b and b.get("model") == adapter.name)
    assert sent["max_tokens"] == 12 and sent["stream"] is False
    assert sent["messages"][-1]["content"] in (question, "stream it back")

    # the budget counter holds what the client paid, never the shadow runs ...
    paid = sum(to_micro(r.cost_usd) for r in requests)
    wait_for(lambda: _spent(redis_client, app, sworld.tenant.id) == paid, what="settles")
    period = rb.current_period()
    assert ledger_month_spend(period)[sworld.tenant.id] == sum(r.cost_usd for r in requests)
    # ... nor does the reconcile from the ledger put them there
    db.session.add(Budget(tenant_id=sworld.tenant.id, monthly_limit_usd=Decimal("100")))
    db.session.commit()
    reconcile_budget_counters(period)
    request_sum = sum(r.cost_usd for r in requests)
    with_shadow = request_sum + sum(r.cost_usd for r in shadows.values())
    assert to_micro(with_shadow) > to_micro(request_sum)
    assert _spent(redis_client, app, sworld.tenant.id) == to_micro(request_sum)
    # FinOps rollups leave them out too, and still agree with the ledger
    rollups.rebuild_all()
    cost = db.session.scalar(sa.select(sa.func.sum(Rollup.cost_usd)).where(
        Rollup.grain == "hour", Rollup.tenant_id == sworld.tenant.id))
    assert cost == sum(r.cost_usd for r in requests)
    assert rollups.reconcile(period) == []


def test_shadow_run_asks_the_adapter_in_the_form_it_learned(app, gateway, fake_replicas,
                                                           frontier):
    """The adapter learned aliases (minify on when its dataset froze); the tenant has turned
    minify off since: the shadow run still sends it the aliases, and its answer, expanded,
    is judged against the client's."""
    from app.contract.policy import form_of
    from app.contract.policy import DEFAULTS
    w = make_world(app, gateway, [s.url for s in fake_replicas], frontier.url,
                   policy={"cache_enabled": False, "minify_enabled": False})
    learned = form_of({**DEFAULTS, "minify_enabled": True, "minify_compact_json": False})
    adapter = _shadow_adapter(w, [r.id for r in w.pool.replicas], form=learned)
    schema = {"type": "object", "additionalProperties": False,
              "properties": {"customer_full_name": {"type": "string"},
                             "invoice_total_amount": {"type": "number"}},
              "required": ["customer_full_name", "invoice_total_amount"]}
    r = _post(w, "invoice of Ada Lovelace for 12 EUR [[json:1]]", response_format={
        "type": "json_schema", "json_schema": {"name": "inv", "schema": schema}})
    rows = w.drain_rows(2)
    shadow = next(row for row in rows if row.kind == "shadow")
    assert shadow.payload["shadow_of"] == r.headers["x-sluice-request-id"]
    assert shadow.payload["agreed"] is True
    bodies = [httpx.get(s.url + "/stats").json()["last_body"] for s in fake_replicas]
    sent = next(b for b in bodies if b and b.get("model") == adapter.name)
    props = set(sent["response_format"]["json_schema"]["schema"]["properties"])
    assert len(props) == 2 and not props & set(schema["properties"])   # the aliases


def _metric(w, outcome: str) -> float:
    text = httpx.get(w.gateway.url + "/metrics").text
    for line in text.splitlines():
        if line.startswith(f'sluice_gateway_shadow_runs_total{{outcome="{outcome}"}}'):
            return float(line.split()[-1])
    return 0.0


def test_failed_shadow_run_changes_nothing_for_the_client(app, sworld):
    dead = Replica(pool_id=sworld.pool.id, index=9, url="http://127.0.0.1:9", state="healthy")
    db.session.add(dead)
    db.session.commit()
    failed_before = _metric(sworld, "failed")
    _shadow_adapter(sworld, [dead.id])          # loaded only where nothing answers
    r = _post(sworld, "the shadow will fail")
    assert r.json()["choices"][0]["message"]["content"].startswith("Echo:")
    wait_for(lambda: _metric(sworld, "failed") > failed_before, what="failed shadow run")
    rows = sworld.drain_rows(1)
    assert [r.kind for r in rows] == ["request"]


def _post_alone(w, prompt: str, **kw) -> None:
    """Post, wait for the request's own ledger event, then check no shadow event follows it.

    The gateway writes ledger events shortly after answering (the writer batches), so the count is
    taken before the request and awaited to grow by exactly the request's own event first."""
    before = health(w.gateway)["ledger_written"]
    _post(w, prompt, **kw)
    wait_for(lambda: health(w.gateway)["ledger_written"] >= before + 1, what="the request's event")
    time.sleep(0.5)
    assert health(w.gateway)["ledger_written"] == before + 1


def test_tier_one_answers_and_unsampled_requests_are_not_shadowed(app, sworld):
    adapter = _shadow_adapter(sworld, [r.id for r in sworld.pool.replicas])
    _post_alone(sworld, "answered by tier one", model="tier-1")
    adapter.shadow = {"sample_pct": 0}
    db.session.commit()
    publish_and_wait(sworld.gateway)
    _post_alone(sworld, "not sampled")
    assert [(r.kind, r.tier) for r in sworld.drain_rows(2)] == [("request", "tier-1"),
                                                               ("request", "tier-3")]


# --- the gate -----------------------------------------------------------------------------

def _verdicts(adapter: Adapter, agreed: int, disagreed: int) -> None:
    now = datetime.now(timezone.utc)
    flags = [True] * agreed + [False] * disagreed
    db.session.add_all([LedgerEntry(
        request_id=f"req_{adapter.name}_{i}-shadow", kind="shadow", at=now,
        tenant_id=adapter.tenant_id, workflow=adapter.workflow, tier="tier-1",
        model=adapter.name, adapter=adapter.name, cost_usd=Decimal("0.0001"),
        payload={"shadow_of": f"req_{adapter.name}_{i}", "adapter": adapter.name,
                 "agreed": flag}) for i, flag in enumerate(flags)])
    db.session.commit()


def test_shadow_rollup_submits_an_adapter_that_meets_the_gate(app, monkeypatch):
    from workers.tasks import adapters as tasks
    monkeypatch.setitem(app.config, "ADAPTERS_SHADOW_MIN_REQUESTS", 10)
    pool, strict, lenient = PoolFactory(), TenantFactory(), TenantFactory()
    db.session.add(Policy(tenant_id=lenient.id, values={"shadow_concordance": 0.9}))

    def shadow(tenant, name):
        a = Adapter(tenant_id=tenant.id, workflow=f"wf-{name}", pool_id=pool.id, name=name,
                    state="shadow", shadow={"sample_pct": 50})
        db.session.add(a)
        db.session.commit()
        return a
    good, fair, few, fair_lenient = (shadow(strict, "good"), shadow(strict, "fair"),
                                     shadow(strict, "few"), shadow(lenient, "fair-l"))
    _verdicts(good, 10, 0)
    _verdicts(fair, 9, 1)          # 0.90 < the default 0.99
    _verdicts(few, 5, 0)           # too few verdicts
    _verdicts(fair_lenient, 9, 1)  # this tenant asks for 0.90
    # the adapter's own served requests are no verdicts
    db.session.add(LedgerEntry(request_id="req_served", kind="request", tenant_id=strict.id,
                               adapter="fair", payload={"agreed": True}))
    db.session.commit()

    out = {line["name"]: line for line in tasks.shadow_rollup.run()}
    assert {n: line["submitted"] for n, line in out.items()} == {
        "good": True, "fair": False, "few": False, "fair-l": True}
    db.session.expire_all()
    states = {a.name: a.state for a in db.session.scalars(sa.select(Adapter))}
    assert states == {"good": "awaiting_approval", "fair": "shadow", "few": "shadow",
                      "fair-l": "awaiting_approval"}
    good = db.session.get(Adapter, good.id)
    assert good.shadow["requests"] == 10 and good.shadow["agreed"] == 10
    assert good.shadow["concordance"] == 1.0 and good.shadow["sample_pct"] == 50
    assert 0.69 < good.shadow["ci_low"] < 0.73 and good.shadow["ci_high"] == 1.0
    fair = db.session.get(Adapter, fair.id)
    assert fair.shadow["requests"] == 10 and fair.shadow["concordance"] == 0.9
    assert fair.shadow["ci_low"] < 0.9 < fair.shadow["ci_high"]
    (event,) = db.session.scalars(sa.select(AdapterEvent).where(
        AdapterEvent.adapter_id == good.id))
    assert (event.event, event.actor_email, event.comment, event.to_state) == (
        "submit", "system", "shadow gate met", "awaiting_approval")
    assert event.data["requests"] == 10 and event.data["threshold"] == 0.99


def test_shadow_rollup_default_gate_needs_200_verdicts(app):
    from app.adapters.serving import shadow_rollup
    pool, tenant = PoolFactory(), TenantFactory()
    a = Adapter(tenant_id=tenant.id, workflow="wf", pool_id=pool.id, name="below",
                state="shadow")
    db.session.add(a)
    db.session.commit()
    _verdicts(a, 150, 0)
    assert app.config["ADAPTERS_SHADOW_MIN_REQUESTS"] == 200
    (line,) = shadow_rollup()
    assert line["requests"] == 150 and line["submitted"] is False
    db.session.expire_all()
    assert db.session.get(Adapter, a.id).state == "shadow"
