"""Trace capture: the scrubber, the gateway's frontier answers reaching adapter_traces
through the stream and its drain, and feedback verdicts reaching the traces."""
from __future__ import annotations

import httpx
import orjson
import pytest

from app.adapters.models import AdapterTrace
from app.adapters.traces import count_usable, drain_traces, refresh_verdicts, scrub
from app.extensions import db
from app.redis_client import keys
from tests.gateway.conftest import make_world, wait_for


@pytest.mark.parametrize("text, masked, kept", [
    ("write to alice.smith+orders@example.co.uk today", "[EMAIL]", "today"),
    ("call +1 (415) 555-0100 or 415-555-0100", "[PHONE]", "call"),
    ("card 4111 1111 1111 1111 exp 12/29", "[CARD]", "exp 12/29"),
    ("pay with 4111-1111-1111-1111", "[CARD]", "pay with"),
    ("key sk-proj-AbCdEf0123456789xyz please", "[SECRET]", "please"),
    ("our sluice key sk-sl-0123456789abcdefABCDEF", "[SECRET]", "our sluice key"),
    ("Authorization: Bearer abcdefghijklmnopqrstuv", "Bearer [SECRET]", "Authorization"),
    ("password=hunter22 and api_key: 'zz9zz9'", "password=[SECRET]", "api_key: [SECRET]"),
    ("token ghp_abcdefghijklmnopqrstuvwxyz0123 and AKIAABCDEFGHIJKLMNOP", "[SECRET]", "token"),
])
def test_scrub_masks_personal_data_and_secrets(text, masked, kept):
    out = scrub(text)
    assert masked in out and kept in out


def test_scrub_keeps_ordinary_numbers_and_ids():
    text = "Order #A123: 3 x blue widget on 2024-05-01, total 1234.56, qty 1500000, v1.2.3"
    assert scrub(text) == text
    assert scrub("") == ""


def _event(rid: str, tenant_id: int, **kw) -> dict:
    return {"request_id": rid, "at": "2026-01-01T00:00:00+00:00", "tenant_id": tenant_id,
            "workflow": "wf-orders", "tier": "tier-3",
            "messages": [{"role": "user", "content": "mail bob@example.com"}],
            "response_format": None, "answer": "done", **kw}


def test_drain_is_idempotent_and_drops_malformed_entries(app, redis_client):
    stream = keys().trace_stream()
    drain_traces()   # what earlier tests' gateway requests left on the stream
    db.session.execute(db.delete(AdapterTrace))
    db.session.commit()
    for ev in (_event("req_t1", 7), _event("req_t2", 7), _event("req_t1", 7, answer="again")):
        redis_client.xadd(stream, {"e": orjson.dumps(ev)})
    redis_client.xadd(stream, {"e": b"{not json"})
    redis_client.xadd(stream, {"e": orjson.dumps(_event("req_t3", 7, messages=[]))})
    assert drain_traces() == 2
    redis_client.xadd(stream, {"e": orjson.dumps(_event("req_t2", 7, answer="late copy"))})
    assert drain_traces() == 0
    rows = {t.request_id: t for t in db.session.scalars(db.select(AdapterTrace))}
    assert set(rows) == {"req_t1", "req_t2"}
    assert rows["req_t1"].answer == "done" and rows["req_t2"].answer == "done"
    assert rows["req_t1"].max_tokens is None   # an event without one (older gateways)
    redis_client.xadd(stream, {"e": orjson.dumps(_event("req_t4", 7, max_tokens=64))})
    redis_client.xadd(stream, {"e": orjson.dumps(_event("req_t5", 7, max_tokens="lots"))})
    assert drain_traces() == 2
    assert db.session.get(AdapterTrace, db.session.scalar(db.select(AdapterTrace.id).where(
        AdapterTrace.request_id == "req_t4"))).max_tokens == 64
    assert db.session.scalar(db.select(AdapterTrace.max_tokens).where(
        AdapterTrace.request_id == "req_t5")) is None
    # the drain scrubs again: a writer that skipped the scrubber leaks nothing
    assert rows["req_t1"].messages == [{"role": "user", "content": "mail [EMAIL]"}]
    assert redis_client.xlen(stream) == 0   # acked and deleted after the commit


@pytest.fixture()
def world(app, gateway, fake_replicas, frontier):
    return make_world(app, gateway, [s.url for s in fake_replicas], frontier.url)


SYSTEM = {"role": "system", "content": "Extract the order as JSON."}


def _trace(rid: str) -> AdapterTrace | None:
    drain_traces()
    db.session.expire_all()
    return db.session.scalar(db.select(AdapterTrace).where(AdapterTrace.request_id == rid))


def test_frontier_answers_of_a_workflow_become_scrubbed_traces(world):
    client = world.client()
    frontier = client.chat.completions.with_raw_response.create(model="tier-3", max_tokens=48,
                                                                messages=[
        SYSTEM, {"role": "user", "content": "Order A1 for carol@example.org, 2 bolts"}])
    small = client.chat.completions.with_raw_response.create(model="tier-1", messages=[
        SYSTEM, {"role": "user", "content": "Order A2 for dan@example.org, 1 bolt"}])
    rid = frontier.headers["x-sluice-request-id"]
    trace = wait_for(lambda: _trace(rid), what="the frontier answer's trace")
    assert trace.tenant_id == world.tenant.id and trace.tier == "tier-3"
    assert trace.workflow == frontier.headers["x-sluice-workflow"]
    assert trace.messages[0] == SYSTEM
    assert trace.messages[1]["content"] == "Order A1 for [EMAIL], 2 bolts"
    assert "carol@" not in trace.answer and "[EMAIL]" in trace.answer  # the fake echoes
    assert trace.verdict is None
    assert trace.max_tokens == 48    # the client's cap: the offline evaluation's too
    # tier 1 is not the frontier: no trace
    world.wait_ledger(2)
    assert _trace(small.headers["x-sluice-request-id"]) is None

    # a validator's "fail" reaches the trace through the ledger row, and the trace no
    # longer counts towards a dataset
    assert count_usable(world.tenant.id, trace.workflow) == 1
    r = httpx.post(world.base_url + "/feedback", headers={"authorization": f"Bearer {world.key}"},
                   json={"request_id": rid, "verdict": "fail"})
    assert r.status_code == 202
    world.drain_rows(2)
    assert refresh_verdicts(world.tenant.id, trace.workflow) == 1
    db.session.commit()
    assert _trace(rid).verdict == "fail"
    assert count_usable(world.tenant.id, trace.workflow) == 0


def test_a_streamed_frontier_answer_becomes_a_trace_too(world):
    """Streams at the default temperature skip the cache, which was the only reason the
    relay assembled an answer: the flywheel asks for it itself."""
    stream = world.client().chat.completions.with_raw_response.create(
        model="tier-3", stream=True,
        messages=[SYSTEM, {"role": "user", "content": "Order B7 for 3 nuts"}])
    rid = stream.headers["x-sluice-request-id"]
    text = "".join(c.choices[0].delta.content or "" for c in stream.parse() if c.choices)
    trace = wait_for(lambda: _trace(rid), what="the streamed answer's trace")
    assert trace.answer == text == "Echo: Order B7 for 3 nuts"
