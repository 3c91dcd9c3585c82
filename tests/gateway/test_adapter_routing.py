"""LoRA adapters on the request path: which arm a routing key gets (pure), and through the
running gateway: a promoted adapter serves its workflow's tier-1 requests
(``model=<adapter>``, booked on the ledger row), a canary takes its share of session
keys and keeps each key in its arm, and a replica where the load failed gets none of it."""
from __future__ import annotations

import httpx
import pytest

from app.contract.snapshot import AdapterEntry, Snapshot
from app.gateway import adapters
from app.gateway.context import RequestContext
from tests.gateway.conftest import make_world, publish_and_wait

WORKFLOW = "ticket-routing"
MSGS = [{"role": "user", "content": "where does this ticket go"}]
# No engine cache salt: a session's routing key is "s::<session>", known to the test;
# no S00 cache: every request reaches a replica.
POLICY = {"cache_salt": False, "cache_enabled": False}


# --- the arm of a routing key (pure) ------------------------------------------------------

def _canary(pct: int, previous: str | None = "lora-old") -> AdapterEntry:
    return AdapterEntry(name="lora-new", state="canary", canary_pct=pct, pool_id=7,
                        replicas_loaded=(1, 2), previous_name=previous,
                        previous_replicas_loaded=(1,) if previous else ())


KEYS = [f"s::session-{i}" for i in range(5000)]


def test_canary_arm_is_consistent_and_near_its_share():
    for pct in (5, 25, 50):
        entry = _canary(pct)
        arms = [adapters.arm(entry, k) for k in KEYS]
        assert arms == [adapters.arm(entry, k) for k in KEYS]   # same key, same arm
        share = sum(1 for a in arms if a[0] == "lora-new") / len(KEYS)
        assert abs(share - pct / 100) < 0.03, (pct, share)
        assert {a for a in arms if a[0] == "lora-old"} == {("lora-old", (1,))}


def test_raising_the_canary_only_moves_keys_to_the_new_adapter():
    steps = [0, 5, 25, 60, 100]
    new_at = {pct: {k for k in KEYS if adapters.arm(_canary(pct), k)[0] == "lora-new"}
              for pct in steps}
    for lo, hi in zip(steps, steps[1:]):
        assert new_at[lo] <= new_at[hi]
    assert not new_at[0] and new_at[100] == set(KEYS)


def test_without_a_previous_adapter_the_rest_get_the_base_model():
    entry = _canary(25, previous=None)
    arms = {adapters.arm(entry, k) for k in KEYS}
    assert arms == {None, ("lora-new", (1, 2))}
    promoted = AdapterEntry(name="lora-p", state="promoted", canary_pct=100, pool_id=7,
                            replicas_loaded=(2,))
    assert {adapters.arm(promoted, k) for k in KEYS[:200]} == {("lora-p", (2,))}
    assert adapters.arm(None, KEYS[0]) is None


def _ctx(tier_name: str, replica_id: int | None, session: str = "s1") -> RequestContext:
    pool = {"id": 7, "name": "p", "served_model_name": "base",
            "replicas": [{"id": i, "name": f"r{i}", "url": f"http://r{i}", "state": "healthy"}
                         for i in (1, 2)]}
    tiers = [{"name": "t1", "rank": 1, "model": "m", "upstream_kind": "pool", "pool_id": 7},
             {"name": "t2", "rank": 2, "model": "m", "upstream_kind": "pool", "pool_id": 7}]
    entry = AdapterEntry(name="lora-p", state="promoted", canary_pct=100, pool_id=7,
                         replicas_loaded=(2,))
    snap = Snapshot({"version": 1, "tiers": tiers, "pools": {"7": pool},
                     "adapters": {"1:wf": entry.to_json()}})
    ctx = RequestContext(request_id="r", snapshot=snap, tenant={"id": 1, "policy": {}},
                         key={}, body={}, workflow_signature="wf",
                         routing_key=f"s::{session}")
    ctx.tier = snap.tiers_by_name[tier_name]
    ctx.replica = {"id": replica_id} if replica_id is not None else None
    return ctx


def test_adapter_for_needs_tier_one_and_a_replica_that_loaded_it():
    reps = [{"id": 1, "url": "http://r1"}, {"id": 2, "url": "http://r2"}]
    assert adapters.adapter_for(_ctx("t1", 2)) == "lora-p"
    assert adapters.adapter_for(_ctx("t1", 1)) is None          # not loaded there
    assert adapters.adapter_for(_ctx("t2", 2)) is None          # tier 2 on the same pool
    assert adapters.replicas_for(_ctx("t1", None), reps) == [reps[1]]
    assert adapters.replicas_for(_ctx("t2", None), reps) == reps
    assert adapters.replicas_for(_ctx("t1", None), reps[:1]) == reps[:1]  # none: base model
    other = _ctx("t1", 2)
    other.workflow_signature = "another"
    assert adapters.adapter_for(other) is None


# --- through the gateway ------------------------------------------------------------------

@pytest.fixture()
def aworld(app, gateway, fake_replicas, frontier):
    return make_world(app, gateway, [s.url for s in fake_replicas], frontier.url,
                      policy=POLICY)


def _replica_ids(w, fake_replicas) -> dict[str, int]:
    """fake replica name (r0, r1) -> Replica id"""
    url_to_name = {s.url: f"r{i}" for i, s in enumerate(fake_replicas)}
    return {url_to_name[r.url]: r.id for r in w.pool.replicas}


def _adapter(w, name: str, state: str, loaded: dict, canary_pct: int = 100, **cols):
    from app.adapters.models import Adapter
    from app.extensions import db
    a = Adapter(tenant_id=w.tenant.id, workflow=cols.pop("workflow", WORKFLOW),
                pool_id=w.pool.id, name=name, state=state, canary_pct=canary_pct,
                loaded={str(k): v for k, v in loaded.items()},
                artifact_path=f"/tmp/{name}", **cols)
    db.session.add(a)
    db.session.commit()
    return a


def _send(w, fake_replicas, session: str, model: str = "tier-1",
          workflow: str = WORKFLOW) -> tuple[str, str]:
    """(replica that answered, model it was asked for)"""
    r = httpx.post(w.base_url + "/chat/completions", timeout=30,
                   headers={"authorization": f"Bearer {w.key}", "x-sluice-session": session,
                            "x-sluice-workflow": workflow},
                   json={"model": model, "messages": MSGS, "max_tokens": 8})
    assert r.status_code == 200, r.text
    name = r.headers["x-fake-replica"]
    body = httpx.get(fake_replicas[int(name[1:])].url + "/stats").json()["last_body"]
    return name, body["model"]


def test_promoted_adapter_serves_its_workflow_on_tier_one(aworld, fake_replicas):
    ids = _replica_ids(aworld, fake_replicas)
    _adapter(aworld, f"lora-p{aworld.tenant.id}", "promoted", {ids["r0"]: "ok", ids["r1"]: "ok"})
    publish_and_wait(aworld.gateway)
    name = f"lora-p{aworld.tenant.id}"
    assert _send(aworld, fake_replicas, "a")[1] == name
    assert _send(aworld, fake_replicas, "b")[1] == name
    assert _send(aworld, fake_replicas, "a", model="tier-2")[1] == "tiny-served"
    assert _send(aworld, fake_replicas, "a", workflow="something-else")[1] == "tiny-served"
    rows = aworld.drain_rows(4)
    assert [r.adapter for r in rows] == [name, name, "", ""]
    assert [r.tier for r in rows] == ["tier-1", "tier-1", "tier-2", "tier-1"]
    assert rows[0].payload["caching_and_routing_decision"]["adapter"] == name
    assert all(r.kind == "request" for r in rows)


def test_canary_takes_its_share_of_sessions_and_keeps_each(aworld, fake_replicas):
    ids = _replica_ids(aworld, fake_replicas)
    both = {ids["r0"]: "ok", ids["r1"]: "ok"}
    old, new = f"lora-o{aworld.tenant.id}", f"lora-c{aworld.tenant.id}"
    _adapter(aworld, old, "promoted", both)
    _adapter(aworld, new, "canary", both, canary_pct=25)
    publish_and_wait(aworld.gateway)
    sessions = [f"sess-{i}" for i in range(60)]
    got = {s: _send(aworld, fake_replicas, s)[1] for s in sessions}
    expected = {s: new if adapters.bucket(f"s::{s}", new) < 25 else old for s in sessions}
    assert got == expected
    n_new = sum(1 for m in got.values() if m == new)
    assert 6 <= n_new <= 26, n_new   # about a quarter of 60
    for s in sessions[:10]:          # the same key twice: the same arm
        assert _send(aworld, fake_replicas, s)[1] == got[s]


def test_replica_where_the_load_failed_gets_no_adapter_traffic(aworld, fake_replicas):
    ids = _replica_ids(aworld, fake_replicas)
    name = f"lora-f{aworld.tenant.id}"
    _adapter(aworld, name, "promoted", {ids["r0"]: "HTTP 500: out of memory",
                                        ids["r1"]: "ok"})
    publish_and_wait(aworld.gateway)
    seen = {_send(aworld, fake_replicas, f"k{i}") for i in range(12)}
    assert seen == {("r1", name)}
    # tier 2 on the same pool still uses both replicas, with the base model
    seen2 = {_send(aworld, fake_replicas, f"k{i}", model="tier-2") for i in range(24)}
    assert {m for _, m in seen2} == {"tiny-served"} and {r for r, _ in seen2} == {"r0", "r1"}


# --- an adapter is served in the form it learned ---------------------------------------------

SCHEMA = {"type": "object", "properties": {"customer_full_name": {"type": "string"},
                                           "invoice_total_amount": {"type": "number"}},
          "required": ["customer_full_name", "invoice_total_amount"],
          "additionalProperties": False}
FMT = {"type": "json_schema", "json_schema": {"name": "inv", "schema": SCHEMA}}


def _schema_ask(w, fake_replicas, model: str) -> tuple[dict, dict]:
    """(the client's parsed answer, the body the replica got) for a schema request."""
    r = httpx.post(w.base_url + "/chat/completions", timeout=30,
                   headers={"authorization": f"Bearer {w.key}", "x-sluice-session": "s",
                            "x-sluice-workflow": WORKFLOW},
                   json={"model": model, "response_format": FMT, "max_tokens": 64,
                         "messages": [{"role": "user", "content":
                                       "invoice of Ada Lovelace for 12 EUR [[json:1]]"}]})
    assert r.status_code == 200, r.text
    sent = httpx.get(fake_replicas[int(r.headers["x-fake-replica"][1:])].url
                     + "/stats").json()["last_body"]
    import json
    return json.loads(r.json()["choices"][0]["message"]["content"]), sent


def _keys_sent(sent: dict) -> set[str]:
    return set(sent["response_format"]["json_schema"]["schema"]["properties"])


@pytest.mark.parametrize("policy_minify", [False, True])
def test_adapter_is_served_in_the_form_it_learned(app, gateway, fake_replicas, frontier,
                                                  policy_minify):
    """The adapter learned the other form than the tenant's policy gives now (minify
    turned off after it was trained on aliases, or on after it was trained on full keys):
    it gets its own form, tier 2 on the same pool gets the policy's, and the client gets
    its own keys from both."""
    from app.contract.policy import form_of
    from app.contract.policy import DEFAULTS
    w = make_world(app, gateway, [s.url for s in fake_replicas], frontier.url,
                   policy={**POLICY, "minify_enabled": policy_minify,
                           "minify_compact_json": False})
    ids = _replica_ids(w, fake_replicas)
    name = f"lora-m{w.tenant.id}"
    learned = form_of({**DEFAULTS, "minify_enabled": not policy_minify,
                       "minify_compact_json": False})
    _adapter(w, name, "promoted", {ids["r0"]: "ok", ids["r1"]: "ok"}, form=learned)
    publish_and_wait(w.gateway)
    client_keys = set(SCHEMA["properties"])

    answer, sent = _schema_ask(w, fake_replicas, "tier-1")
    assert sent["model"] == name
    assert (_keys_sent(sent) == client_keys) is policy_minify   # the adapter's form
    assert set(answer) == client_keys and answer["invoice_total_amount"] == 2
    answer2, sent2 = _schema_ask(w, fake_replicas, "tier-2")
    assert sent2["model"] == "tiny-served"
    assert (_keys_sent(sent2) == client_keys) is not policy_minify   # the policy's form
    assert set(answer2) == client_keys
    rows = w.drain_rows(2)
    assert [r.adapter for r in rows] == [name, ""]
    assert rows[0].payload["pipeline"]["served_form"] == "adapter"
    assert "served_form" not in rows[1].payload["pipeline"]


def test_adapter_that_learned_the_policys_form_or_none_is_served_as_the_policy_says(
        app, gateway, fake_replicas, frontier):
    from app.contract.policy import form_of
    from app.contract.policy import DEFAULTS
    w = make_world(app, gateway, [s.url for s in fake_replicas], frontier.url,
                   policy={**POLICY, "minify_compact_json": False})
    ids = _replica_ids(w, fake_replicas)
    both = {ids["r0"]: "ok", ids["r1"]: "ok"}
    same = form_of({**DEFAULTS, "minify_compact_json": False})
    _adapter(w, f"lora-s{w.tenant.id}", "promoted", both, form=same)
    publish_and_wait(w.gateway)
    answer, sent = _schema_ask(w, fake_replicas, "tier-1")
    assert sent["model"] == f"lora-s{w.tenant.id}" and not _keys_sent(sent) & set(answer)
    assert set(answer) == set(SCHEMA["properties"])
    assert "served_form" not in w.drain_rows(1)[0].payload["pipeline"]
