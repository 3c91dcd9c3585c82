"""Issue 7 end to end: a json_schema request with verbose keys, a nested object, an array
of objects, a $ref'd enum and verbose enum values goes through the gateway (policy
minify_enums on) to the reference engine, which enforces the minified schema with
xgrammar: the engine generates aliases for keys and enum values, the client (openai SDK)
gets its own keys and values back, streamed and not; with letter aliases and with semantic
ones (a word of each key)."""
from __future__ import annotations

import json
from decimal import Decimal

import jsonschema
import pytest

from app.core.minify_alias import key_words
from app.contract.tokenizers import count_tokens
from tests.gateway.conftest import make_world

STATUS = ["AWAITING_CUSTOMER_RESPONSE", "ESCALATED_TO_ENGINEERING",
          "RESOLVED_PENDING_CONFIRMATION"]


def _obj(props: dict) -> dict:
    return {"type": "object", "properties": props, "required": list(props),
            "additionalProperties": False}


SCHEMA = {
    "$defs": {"ticket_workflow_status": {"enum": STATUS}},
    **_obj({
        "ticket_priority_level": {"enum": ["low", "high"]},
        "requires_manager_escalation": {"type": "boolean"},
        "current_ticket_status": {"$ref": "#/$defs/ticket_workflow_status"},
        "assigned_support_agent": _obj({
            "agent_seniority_band": {"enum": ["JUNIOR_SUPPORT_ENGINEER",
                                              "SENIOR_SUPPORT_ENGINEER"]},
            "agent_is_currently_on_call": {"type": "boolean"}}),
        "affected_product_areas": {"type": "array", "minItems": 1, "maxItems": 2,
                                   "items": _obj({
                                       "product_area_name": {"enum": ["billing", "login"]},
                                       "previous_area_statuses": {
                                           "type": "array", "maxItems": 2,
                                           "items": {"$ref": "#/$defs/ticket_workflow_status"}}})},
    })}
FMT = {"type": "json_schema", "json_schema": {"name": "ticket", "schema": SCHEMA}}
MSGS = [{"role": "system", "content": "Classify the ticket. Fill ticket_priority_level and "
                                      "current_ticket_status."},
        {"role": "user", "content": "I cannot log in and my invoice is wrong."}]


def _keys(value, out: set[str]) -> set[str]:
    if isinstance(value, dict):
        out.update(value)
        for v in value.values():
            _keys(v, out)
    elif isinstance(value, list):
        for v in value:
            _keys(v, out)
    return out


def _outside_strings(text: str) -> str:
    """``text`` with every JSON string literal removed."""
    out, in_str, esc = [], False, False
    for ch in text:
        if in_str:
            esc, in_str = (False, True) if esc else (ch == "\\", ch != '"')
        elif ch == '"':
            in_str = True
        else:
            out.append(ch)
    return "".join(out)


def _client_got_originals(content: str) -> dict:
    """The client's answer validates against its own schema: every key is one of its keys
    (additionalProperties false everywhere), every enum value one of its values."""
    answer = json.loads(content)
    jsonschema.validate(answer, SCHEMA)
    assert _keys(answer, set()) <= {"ticket_priority_level", "requires_manager_escalation",
                                    "current_ticket_status", "assigned_support_agent",
                                    "agent_seniority_band", "agent_is_currently_on_call",
                                    "affected_product_areas", "product_area_name",
                                    "previous_area_statuses"}
    assert answer["current_ticket_status"] in STATUS
    return answer


@pytest.mark.parametrize("style", ["letters", "semantic"])
def test_client_gets_original_keys_and_values_engine_generates_aliases(app, gateway, engine,
                                                                       frontier, style):
    w = make_world(app, gateway, [engine.url], frontier.url,
                   policy={"minify_enums": True, "minify_alias_style": style})
    client = w.client(timeout=180)
    resp = client.chat.completions.create(model="tier-1", messages=MSGS, response_format=FMT,
                                          max_tokens=200, temperature=0)
    content = resp.choices[0].message.content
    _client_got_originals(content)
    assert resp.choices[0].finish_reason == "stop"
    # the pool got a compact-separator grammar: no whitespace between the JSON's tokens
    assert not any(c.isspace() for c in _outside_strings(content)), content
    # the engine counted fewer tokens than the text the client got: it wrote the aliases
    assert resp.usage.completion_tokens < count_tokens(content, "smollm2")

    chunks = list(client.chat.completions.create(
        model="tier-1", messages=MSGS, response_format=FMT, max_tokens=200, temperature=0.5,
        seed=7, stream=True, stream_options={"include_usage": True}))
    deltas = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    streamed = "".join(deltas)
    _client_got_originals(streamed)
    assert not any(c.isspace() for c in _outside_strings(streamed)), streamed
    assert len([d for d in deltas if d]) > 5  # really streamed, in many pieces
    assert chunks[-1].usage.completion_tokens < count_tokens(streamed, "smollm2")
    assert all(getattr(c, "sluice_schema_error", None) is None for c in chunks)

    rows = w.drain_rows(2)
    for row in rows:
        pipe = row.payload["pipeline"]
        mini = pipe["minify"]
        assert mini["tokenizer"] == "smollm2"
        # keys renamed at the root, in the nested object and in the array's objects
        assert {"current_ticket_status", "$.assigned_support_agent.agent_seniority_band",
                "$.affected_product_areas[].previous_area_statuses"} <= set(mini["aliases"])
        assert {k.split("=", 1)[1] for k in mini["value_aliases"]} == {
            *STATUS, "JUNIOR_SUPPORT_ENGINEER", "SENIOR_SUPPORT_ENGINEER",
            "billing"}  # two SmolLM2 tokens; "login", "low", "high" are one and stay
        assert mini["alias_style"] == style
        if style == "letters":
            assert all(len(a) == 1 for a in mini["value_aliases"].values())
            assert all(len(a) == 1 for a in mini["aliases"].values())
        else:  # each value's alias is a word of its own, or a letter where none is its own
            assert all(a in key_words(k.split("=", 1)[1]) or len(a) == 1
                       for k, a in mini["value_aliases"].items()), mini["value_aliases"]
            # each key's alias is one of its own words
            assert all(a in key_words(k.rsplit(".", 1)[-1])
                       for k, a in mini["aliases"].items()), mini["aliases"]
            assert mini["aliases"]["current_ticket_status"] == "status"
        assert mini["compact"] is True
        assert mini["minified_schema_tokens_generated"] == row.completion_tokens
        assert mini["raw_schema_output_tokens_equivalent"] > row.completion_tokens
        # the frontier baseline is priced on the output with the client's own keys
        frontier = w.tiers[3]
        want = (row.prompt_tokens * frontier.price_input_per_m
                + mini["raw_schema_output_tokens_equivalent"] * frontier.price_output_per_m
                ) / 1_000_000
        assert abs(row.baseline_cost_usd - want) < Decimal("1e-9"), (row.baseline_cost_usd, want)
        assert pipe["schema_valid"] is True
        assert "S98_ALERT_SCHEMA_ERR" not in pipe["states"]
        assert not pipe.get("schema_retry")


def test_compact_off_keeps_the_engines_own_separators(app, gateway, engine, frontier):
    """Policy minify_compact_json off: the pool gets response_format, so the engine writes
    xgrammar's ", " and ": " (as vLLM does with disable_any_whitespace)."""
    w = make_world(app, gateway, [engine.url], frontier.url,
                   policy={"minify_compact_json": False})
    content = w.client(timeout=180).chat.completions.create(
        model="tier-1", messages=MSGS, response_format=FMT, max_tokens=200,
        temperature=0).choices[0].message.content
    _client_got_originals(content)
    assert ", " in _outside_strings(content) and ": " in _outside_strings(content), content
    row = w.drain_rows(1)[0]
    assert row.payload["pipeline"]["minify"]["compact"] is False
