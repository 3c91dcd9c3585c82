"""Streams are paid for what was served (security finding 1, "free answers"): a client
that reads part of a streamed answer and hangs up before the usage chunk is booked at the
tokens the gateway relayed, counted with the tier's tokenizer, and the upstream request
is cancelled so the engine stops generating."""
from __future__ import annotations

from decimal import Decimal

import httpx
import orjson

from app.contract import budget as rb
from app.core.costing import to_micro
from tests.gateway.conftest import wait_for

WORDS = " ".join(f"word{i}" for i in range(11))  # the fake answers "Echo: word0 ... word10"


def _stats(server) -> dict:
    return httpx.get(server.url + "/stats", timeout=5).json()


def _cut_after(world, n_content: int, model: str, words: str = WORDS) -> int:
    """Stream, read ``n_content`` content chunks, hang up; returns the chunks read."""
    body = {"model": model, "stream": True,
            "messages": [{"role": "system", "content": "billing suite"},
                         {"role": "user", "content": f"{words} [[chunk-delay:200]]"}]}
    seen, buf = 0, b""
    with httpx.stream("POST", world.base_url + "/chat/completions", json=body, timeout=30,
                      headers={"authorization": f"Bearer {world.key}"}) as r:
        assert r.status_code == 200
        for part in r.iter_raw():
            buf += part
            *events, buf = buf.split(b"\n\n")
            for ev in events:
                if ev.startswith(b"data: {"):
                    delta = orjson.loads(ev[6:])["choices"][0]["delta"]
                    seen += bool(delta.get("content"))
            if seen >= n_content:
                break
    return seen


def test_a_stream_cut_after_n_chunks_is_booked_at_least_n_tokens_and_paid(
        world, frontier, redis_client, app):
    cancelled_before = _stats(frontier)["streams_cancelled"]
    n = _cut_after(world, 3, "tier-3")
    assert n >= 3
    (row,) = world.drain_rows(1)
    assert (row.status, row.payload["error"]) == (499, "client_closed")
    assert row.usage_source == "counted"
    assert row.payload["usage_source"] == "counted"
    assert row.completion_tokens >= n
    assert row.prompt_tokens > 0
    assert row.cost_usd > 0
    # the tenant's budget counter includes it (the hold settled at the booked cost)
    ns = app.config["REDIS_NAMESPACE"]
    st = wait_for(lambda: (s := rb.state(redis_client, ns, world.tenant.id))["spent_micro"]
                  and s["reserved_micro"] == 0 and s, what="settle")
    assert st["spent_micro"] == to_micro(row.cost_usd) > 0
    # and the upstream was cancelled: it stopped long before its 12 content chunks
    stats = wait_for(lambda: (s := _stats(frontier))["streams_cancelled"] > cancelled_before
                     and s, what="upstream cancelled")
    assert stats["last_cancelled_after"] < 12


def test_a_stream_read_to_the_end_keeps_the_engines_usage(world):
    stream = world.client().chat.completions.create(
        model="tier-3", stream=True, messages=[{"role": "user", "content": "all of it"}])
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "Echo: all of it"
    (row,) = world.drain_rows(1)
    assert row.usage_source == "upstream"
    assert (row.prompt_tokens, row.completion_tokens) == (3, 4)  # the fake's own counts


def test_the_finops_dashboard_shows_counted_streams(world, app):
    from app.finops import reports
    from tests.factories import UserFactory
    _cut_after(world, 2, "tier-1")
    (row,) = world.drain_rows(1)
    assert row.usage_source == "counted" and row.cost_usd > Decimal(0)
    period = reports.parse_period()
    data = reports.dashboard(UserFactory(role="finops"), period, world.tenant.id)
    assert data["counted"] == {"requests": 1, "cost": row.cost_usd}
