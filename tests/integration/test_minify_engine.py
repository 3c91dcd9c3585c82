"""Issue 7 end to end: a json_schema request with verbose keys goes through the gateway
to the reference engine (which enforces the schema with xgrammar); the engine generates
the minified keys, the client gets its own keys back, streamed and not."""
from __future__ import annotations

import json

import jsonschema

from app.minify.tokens import count_tokens
from tests.gateway.conftest import make_world

SCHEMA = {"type": "object",
          "properties": {
              "ticket_priority_level": {"enum": ["low", "high"]},
              "requires_manager_escalation": {"type": "boolean"},
              "affected_product_areas": {"type": "array", "maxItems": 2,
                                         "items": {"enum": ["billing", "login"]}}},
          "required": ["ticket_priority_level", "requires_manager_escalation",
                       "affected_product_areas"],
          "additionalProperties": False}
FMT = {"type": "json_schema", "json_schema": {"name": "ticket", "schema": SCHEMA}}
MSGS = [{"role": "system", "content": "Classify the ticket. Fill ticket_priority_level."},
        {"role": "user", "content": "I cannot log in and my invoice is wrong."}]


def test_client_gets_original_keys_engine_generates_minified(app, gateway, engine, frontier):
    w = make_world(app, gateway, [engine.url], frontier.url)
    client = w.client(timeout=120)
    resp = client.chat.completions.create(model="tier-1", messages=MSGS, response_format=FMT,
                                          max_tokens=80, temperature=0)
    content = resp.choices[0].message.content
    jsonschema.validate(json.loads(content), SCHEMA)
    assert resp.choices[0].finish_reason == "stop"
    # the engine counted fewer tokens than the text the client got: it wrote the aliases
    assert resp.usage.completion_tokens < count_tokens(content, "smollm2")

    chunks = list(client.chat.completions.create(
        model="tier-1", messages=MSGS, response_format=FMT, max_tokens=80, temperature=0.5,
        stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(streamed), SCHEMA)
    assert chunks[-1].usage.completion_tokens < count_tokens(streamed, "smollm2")

    rows = w.drain_rows(2)
    for row in rows:
        mini = row.payload["pipeline"]["minify"]
        assert mini["tokenizer"] == "smollm2"
        assert set(mini["aliases"]) == set(SCHEMA["properties"])
        assert all(len(a) < len(k) for k, a in mini["aliases"].items())
        assert mini["minified_schema_tokens_generated"] == row.completion_tokens
        assert mini["raw_schema_output_tokens_equivalent"] > row.completion_tokens
        assert mini["output_token_reduction_pct"] > 0
        assert row.payload["pipeline"]["schema_valid"] is True
        assert "S98_ALERT_SCHEMA_ERR" not in row.payload["pipeline"]["states"]
