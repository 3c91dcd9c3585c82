"""S02/S05 through the gateway with a fake upstream that ignores the schema (it echoes),
so every answer fails validation: the S98 paths, retry and mark."""
from __future__ import annotations

import httpx
import orjson
import pytest

from app.core.minify_compact import STYLE_HINT
from tests.gateway.conftest import make_world
from tests.gateway.test_failover import dead_url

SCHEMA = {"type": "object", "properties": {"customer_full_name": {"type": "string"},
                                           "invoice_total_amount": {"type": "number"}},
          "required": ["customer_full_name", "invoice_total_amount"],
          "additionalProperties": False}
FMT = {"type": "json_schema", "json_schema": {"name": "inv", "schema": SCHEMA}}
MSGS = [{"role": "system", "content": "Return customer_full_name and invoice_total_amount."},
        {"role": "user", "content": "invoice for Ada Lovelace 12 EUR"}]


def _last_body(replica) -> dict:
    return httpx.get(replica.url + "/stats").json()["last_body"]


def _world(app, gateway, fake_replicas, frontier, **policy):
    # these tests read the minified schema the pool got in response_format; with
    # minify_compact_json (default on) it goes as a grammar instead (test at the end)
    policy.setdefault("minify_compact_json", False)
    return make_world(app, gateway, [fake_replicas[0].url], frontier.url, policy=policy)


def test_schema_error_retries_once_with_the_original_body(app, gateway, fake_replicas, frontier):
    w = _world(app, gateway, fake_replicas, frontier)
    resp = w.client().chat.completions.create(model="tier-1", messages=MSGS, response_format=FMT)
    assert resp.choices[0].message.content == "Echo: invoice for Ada Lovelace 12 EUR"
    sent = _last_body(fake_replicas[0])
    assert sent["response_format"] == FMT and sent["messages"][0] == MSGS[0]  # the retry
    row = w.drain_rows(1)[0]
    assert [a["reason"] for a in row.payload["attempts"]] == ["schema_retry"]
    first = row.payload["attempts"][0]
    assert first["completion_tokens"] > 0
    assert row.cost_usd > 0 and row.payload["pipeline"]["schema_error"] is True
    assert "S98_ALERT_SCHEMA_ERR" in row.payload["pipeline"]["states"]


def test_mark_serves_best_effort_with_marker_streamed_and_not(app, gateway, fake_replicas,
                                                              frontier):
    w = _world(app, gateway, fake_replicas, frontier, schema_error_action="mark")
    auth = {"authorization": f"Bearer {w.key}"}
    r = httpx.post(w.base_url + "/chat/completions", headers=auth, timeout=30,
                   json={"model": "tier-1", "messages": MSGS, "response_format": FMT})
    body = r.json()
    assert body["sluice_schema_error"]["code"] == "S98_ALERT_SCHEMA_ERR"
    assert body["sluice_schema_error"]["best_effort"] is True
    sent = _last_body(fake_replicas[0])
    props = sent["response_format"]["json_schema"]["schema"]["properties"]
    assert "customer_full_name" not in props and len(props) == 2  # the upstream saw aliases
    assert "customer_full_name" not in sent["messages"][0]["content"]

    with httpx.stream("POST", w.base_url + "/chat/completions", headers=auth, timeout=30,
                      json={"model": "tier-1", "messages": MSGS, "response_format": FMT,
                            "stream": True}) as s:
        events = [e for e in s.read().split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    chunks = [orjson.loads(e[6:]) for e in events[:-1]]
    final = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert final and final[-1]["sluice_schema_error"]["code"] == "S98_ALERT_SCHEMA_ERR"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "Echo: invoice for Ada Lovelace 12 EUR"


def test_minify_off_passes_the_schema_through(app, gateway, fake_replicas, frontier):
    w = _world(app, gateway, fake_replicas, frontier, minify_enabled=False)
    w.client().chat.completions.create(model="tier-1", messages=MSGS, response_format=FMT)
    assert _last_body(fake_replicas[0])["response_format"] == FMT


@pytest.mark.parametrize("on", [False, True])
def test_enum_values_minified_only_when_the_policy_says(app, gateway, fake_replicas, frontier,
                                                        on):
    schema = {"type": "object", "additionalProperties": False, "required": ["status"],
              "properties": {"status": {"enum": ["AWAITING_CUSTOMER_RESPONSE",
                                                 "ESCALATED_TO_ENGINEERING"]}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
    w = _world(app, gateway, fake_replicas, frontier, schema_error_action="mark",
               minify_enums=on)
    w.client().chat.completions.create(model="tier-1", messages=MSGS, response_format=fmt)
    sent = _last_body(fake_replicas[0])["response_format"]
    if on:
        # semantic aliases (the default style): a word only that value has
        assert sent["json_schema"]["schema"]["properties"]["status"]["enum"] == [
            "customer", "engineering"]
    else:  # "status" is one token: nothing else to minify, passed through as is
        assert sent == fmt


@pytest.mark.parametrize("style, aliases", [("letters", ["a", "b"]),
                                            ("semantic", ["customer", "total"])])
def test_alias_style_from_the_policy_reaches_the_upstream(app, gateway, fake_replicas, frontier,
                                                          style, aliases):
    w = _world(app, gateway, fake_replicas, frontier, schema_error_action="mark",
               minify_alias_style=style)
    w.client().chat.completions.create(model="tier-1", messages=MSGS, response_format=FMT)
    sent = _last_body(fake_replicas[0])
    schema = sent["response_format"]["json_schema"]["schema"]
    assert list(schema["properties"]) == aliases and schema["required"] == aliases
    assert sent["messages"][0]["content"] == f"Return {aliases[0]} and {aliases[1]}."
    row = w.drain_rows(1)[0]
    assert row.payload["pipeline"]["minify"]["alias_style"] == style


def test_pool_gets_a_compact_grammar_instead_of_response_format(app, gateway, fake_replicas,
                                                                frontier):
    """minify_compact_json (default): the pool tier gets vLLM's structured_outputs.grammar
    for the minified schema with "," and ":" and no response_format."""
    w = make_world(app, gateway, [fake_replicas[0].url], frontier.url,
                   policy={"schema_error_action": "mark"})
    w.client().chat.completions.create(model="tier-1", messages=MSGS, response_format=FMT)
    sent = _last_body(fake_replicas[0])
    assert "response_format" not in sent
    grammar = sent["structured_outputs"]["grammar"]
    assert '"\\"customer\\""' in grammar and '"\\"total\\""' in grammar  # the aliases
    assert "customer_full_name" not in grammar and '": "' not in grammar
    # minify_style_hint (default): one line that shows the compact style
    assert sent["messages"][0]["content"] == f"Return customer and total.\n{STYLE_HINT}"
    assert sent["messages"][1] == MSGS[1]
    assert w.drain_rows(1)[0].payload["pipeline"]["minify"]["compact"] is True


def test_style_hint_off_leaves_the_instructions(app, gateway, fake_replicas, frontier):
    w = make_world(app, gateway, [fake_replicas[0].url], frontier.url,
                   policy={"schema_error_action": "mark", "minify_style_hint": False})
    w.client().chat.completions.create(model="tier-1", messages=MSGS, response_format=FMT)
    sent = _last_body(fake_replicas[0])
    assert "grammar" in sent["structured_outputs"]
    assert sent["messages"][0]["content"] == "Return customer and total."


def test_escalation_from_a_pool_to_an_external_tier_swaps_the_grammar_back(app, gateway,
                                                                            frontier):
    dead = make_world(app, gateway, [dead_url()], frontier.url,
                      policy={"schema_error_action": "mark"})
    r = dead.client().chat.completions.with_raw_response.create(
        model="tier-1", messages=MSGS, response_format=FMT)
    assert r.headers["x-sluice-tier"] == "tier-3"
    # the pool is dead: tier-3 (external) got response_format with the minified schema
    sent = _last_body(frontier)
    assert "structured_outputs" not in sent
    assert list(sent["response_format"]["json_schema"]["schema"]["properties"]) == [
        "customer", "total"]
    # and the instructions without the pool's style hint
    assert sent["messages"][0]["content"] == "Return customer and total."
