"""Fuzzing the data path (security issue, must show): the gateway's request body, its SSE
relay and the S05 expander, against the real gateway process.

- Bodies: random JSON values and shapes, invalid UTF-8, deep nesting, oversize, wrong
  content types. Every answer is a JSON 4xx (or a 200 for a body that happens to be a
  valid request), never a 5xx, and the gateway stays healthy.
- A slow client that sends half a body and stops: the gateway does not hang on it (other
  requests are served meanwhile).
- SSE: an upstream that streams malformed events (broken JSON, invalid UTF-8, odd framing,
  chunks without choices): the client gets a clean stream end or an error event, never a
  hang or a 500, and the request is in the ledger.
- S05: any text, in any chunking, through the streaming expander: never raises, and the
  streamed result equals the whole-text result.
"""
from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.core.minify_schema import minify_schema
from app.core.minify_stream import StreamExpander, expand_text
from tests.gateway.conftest import health, make_world

JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) |
    st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner,
                                                                max_size=5),
    max_leaves=25)
FIELDS = st.sampled_from(["model", "messages", "stream", "temperature", "max_tokens",
                          "response_format", "tools", "n", "stop", "logprobs", "top_logprobs",
                          "stream_options", "tool_choice", "seed", "user"])
BODY = st.one_of(
    JSONISH,
    st.dictionaries(FIELDS, JSONISH, max_size=6),
    st.fixed_dictionaries({"model": st.sampled_from(["auto", "tier-1", "nope", ""]),
                           "messages": st.lists(st.dictionaries(
                               st.sampled_from(["role", "content", "name", "tool_calls"]),
                               JSONISH, max_size=3), max_size=3)},
                          optional={"response_format": JSONISH, "stream": JSONISH}))


@pytest.fixture()
def world(app, gateway, fake_replicas, frontier):  # noqa: F811
    return make_world(app, gateway, [s.url for s in fake_replicas], frontier.url)


def _post(world, content: bytes, ctype: str = "application/json") -> httpx.Response:
    return httpx.post(world.base_url + "/chat/completions", content=content, timeout=30,
                      headers={"authorization": f"Bearer {world.key}", "content-type": ctype})


def _clean(r: httpx.Response) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code != 200:
        err = r.json()["error"]
        assert err["message"] and err["type"], err


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(body=BODY)
def test_any_json_body_is_a_clean_answer(world, body):
    _clean(_post(world, json.dumps(body).encode()))


@pytest.mark.parametrize("content, ctype", [
    (b"\xff\xfe{\"model\": \"auto\"}", "application/json"),               # invalid UTF-8
    (b'{"model": "auto", "messages": [{"role": "user", "content": "\xc3\x28"}]}',
     "application/json"),
    (b"[" * 200_000 + b"]" * 200_000, "application/json"),                 # deep (and big)
    (b'{"model": "auto", "response_format": ' + b'{"a":' * 3000 + b"1" + b"}" * 3001,
     "application/json"),
    (b"x" * (70 * 1024), "application/json"),                               # over the cap
    (b"model=auto", "application/x-www-form-urlencoded"),
    (b"", "application/json"),
    (b'{"model": "auto", "messages": "hi"}', "text/plain"),
])
def test_malformed_bytes_are_a_clean_4xx(world, content, ctype):
    r = _post(world, content, ctype)
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:200])
    assert r.json()["error"]["message"]


def test_a_slow_client_does_not_hold_the_gateway(world):
    host, port = world.gateway.url.split("//")[1].split(":")
    s = socket.create_connection((host, int(port)))
    body = b'{"model": "tier-1", "messages": [{"role": "user", "content": "slo'
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
              b"Authorization: Bearer " + world.key.encode() + b"\r\n"
              b"Content-Type: application/json\r\n"
              b"Content-Length: 4000\r\n\r\n" + body)
    try:
        t0 = time.perf_counter()
        ok = world.client().chat.completions.create(
            model="tier-1", messages=[{"role": "user", "content": "meanwhile"}])
        assert ok.choices[0].message.content and time.perf_counter() - t0 < 30
    finally:
        s.close()
    assert health(world.gateway)["ok"]


@pytest.mark.parametrize("seed", range(1, 13))
def test_a_malformed_upstream_stream_ends_cleanly(world, seed):
    with httpx.stream("POST", world.base_url + "/chat/completions", timeout=30,
                      headers={"authorization": f"Bearer {world.key}"},
                      json={"model": "tier-1", "stream": True, "messages": [
                          {"role": "user", "content": f"garbage please [[garbage:{seed}]]"}]}
                      ) as r:
        assert r.status_code < 500
        raw = b"".join(r.iter_bytes())
    if r.status_code == 200:
        text = raw.decode("utf-8")           # the relay only ever sends valid UTF-8
        events = [e for e in text.split("\n\n") if e.strip()]
        assert events, "an empty stream"
        last = events[-1]
        assert last == "data: [DONE]" or '"error"' in last, last[-300:]
    assert health(world.gateway)["ok"]


def test_every_fuzzed_request_is_in_the_ledger(world):
    """The garbage streams above are booked like any other request (one row each)."""
    for seed in (3, 7):
        with httpx.stream("POST", world.base_url + "/chat/completions", timeout=30,
                          headers={"authorization": f"Bearer {world.key}"},
                          json={"model": "tier-1", "stream": True, "messages": [
                              {"role": "user", "content": f"g [[garbage:{seed}]]"}]}) as r:
            b"".join(r.iter_bytes())
    rows = world.drain_rows(2)
    assert len(rows) == 2 and all(row.tenant_id == world.tenant.id for row in rows)
    # a stream cut by the gateway for a malformed event is a 502 in the ledger, and its
    # absurd usage (negative, text) never broke the booking
    assert {row.status for row in rows} <= {200, 502}
    assert all(row.completion_tokens >= 0 and row.cost_usd >= 0 for row in rows)


# --- S05 --------------------------------------------------------------------------------

_KEYMAP = None


def _keymap():
    global _KEYMAP
    if _KEYMAP is None:
        schema = {"type": "object", "properties": {
            "customer_full_legal_name": {"type": "string"},
            "priority_level": {"type": "string", "enum": ["HIGH_PRIORITY_OUTAGE", "LOW_NOISE"]},
            "line_items": {"type": "array", "items": {"type": "object", "properties": {
                "stock_keeping_unit": {"type": "string"}, "quantity_ordered": {
                    "type": "integer"}}}}}}
        _KEYMAP = minify_schema(schema)[1]
    return _KEYMAP


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(text=st.text(alphabet=st.sampled_from(list('{}[]":,\\ abcqplsuHL_0123\n')) |
                    st.characters(), max_size=300),
       cuts=st.lists(st.integers(min_value=0, max_value=300), max_size=12))
def test_s05_streams_any_text_in_any_chunking_like_the_whole(text, cuts):
    km = _keymap()
    whole, _ = expand_text(text, km)
    exp = StreamExpander(km)
    bounds = sorted({0, len(text), *[c for c in cuts if c < len(text)]})
    streamed = "".join(exp.feed(text[a:b]) for a, b in zip(bounds, bounds[1:])) + exp.close()
    assert streamed == whole


def test_s05_survives_very_deep_nesting():
    exp = StreamExpander(_keymap())
    deep = "[" * 100_000 + "]" * 100_000
    out = exp.feed(deep[:150_000]) + exp.feed(deep[150_000:]) + exp.close()
    assert out == deep
