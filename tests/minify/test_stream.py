"""Streaming expansion: only object keys change, as early as possible, in any chunking."""
from __future__ import annotations

import json

from app.core.minify import (SCHEMA_ERR, StreamExpander, best_effort_marker, expand_json,
                             expand_text, expand_tool_arguments, minify_response_format,
                             minify_schema, minify_tools, validate_minified)

S = {"type": "string"}
SCHEMA = {"type": "object", "additionalProperties": False, "properties": {
    "extracted_customer_name": S,
    "customer_orders": {"type": "array", "items": {
        "type": "object", "additionalProperties": False,
        "properties": {"order_reference_code": S, "extracted_customer_name": S}}},
    "free_form_attributes": {"type": "object"}}}
MINIFIED, KM = minify_schema(SCHEMA)


def stream(text, keymap=KM, size=1):
    ex = StreamExpander(keymap)
    parts = [ex.feed(text[i:i + size]) for i in range(0, len(text), size)]
    return parts, parts and "".join(parts) + ex.close(), ex


def test_values_that_look_like_aliases_are_untouched():
    text = '{"a":"a","b":[{"a":"b","b":"a"}],"c":{"x":["a","b"]}}'
    for size in (1, 2, 5, len(text)):
        _, out, ex = stream(text, size=size)
        assert json.loads(out) == {
            "extracted_customer_name": "a",
            "customer_orders": [{"order_reference_code": "b", "extracted_customer_name": "a"}],
            "free_form_attributes": {"x": ["a", "b"]}}
        assert not ex.best_effort


def test_formatting_kept_only_keys_change():
    text = '{\n  "a" : "x\\"y",\n  "b" : [ ]\n}'
    assert expand_json(text, KM) == '{\n  "extracted_customer_name" : "x\\"y",\n  "customer_orders" : [ ]\n}'


def test_emits_everything_but_an_unfinished_key():
    ex = StreamExpander(KM)
    assert ex.feed('{"') == '{"'
    assert ex.feed("a") == ""  # could still become a longer key
    assert ex.feed('":"Jo') == 'extracted_customer_name":"Jo'
    assert ex.feed('hn", "b":[') == 'hn", "customer_orders":['
    assert ex.feed("]}") == "]}"
    assert ex.close() == ""


def test_escaped_keys_and_unicode():
    # "\u0061" is the alias "a" written with an escape; "\ud83d\ude00" is a surrogate pair.
    text = '{"\\u0061":"\\ud83d\\ude00 \\"a\\" \\\\","c":{"\\ud83d\\ude00":"\\u0062"}}'
    _, out, ex = stream(text)
    assert json.loads(out) == {"extracted_customer_name": '😀 "a" \\',
                               "free_form_attributes": {"😀": "b"}}
    assert not ex.best_effort


def test_backslash_split_across_chunks():
    ex = StreamExpander(KM)
    out = ex.feed('{"a":"x\\') + ex.feed('"') + ex.feed('","b":[]}') + ex.close()
    assert json.loads(out) == {"extracted_customer_name": 'x"', "customer_orders": []}


def test_keys_with_quotes_and_unicode_in_originals():
    schema = {"type": "object", "properties": {'the "quoted" key': S, "schlüssel_größe": S}}
    _, km = minify_schema(schema)
    _, out, _ = stream('{"a":"1","b":"2"}', km)
    assert out == '{"the \\"quoted\\" key":"1","schlüssel_größe":"2"}'


def test_unknown_keys_pass_through_in_open_objects():
    _, out, ex = stream('{"c":{"zz_custom":1,"q":{"deep":2}}}')
    assert json.loads(out) == {"free_form_attributes": {"zz_custom": 1, "q": {"deep": 2}}}
    assert not ex.best_effort


def test_alias_outside_its_location_is_still_expanded_and_flagged():
    # The model put an order where the schema has none: aliases never reach the client.
    _, out, ex = stream('{"a":"x","zz":{"a":"y"}}')
    assert json.loads(out) == {"extracted_customer_name": "x",
                               "zz": {"extracted_customer_name": "y"}}
    assert ex.best_effort and "outside its location" in ex.problems[0]


def test_original_keys_written_by_the_model_pass_through():
    text = '{"customer_orders":[{"order_reference_code":"r","b":"n"}]}'
    assert json.loads(expand_json(text, KM)) == {"customer_orders": [
        {"order_reference_code": "r", "extracted_customer_name": "n"}]}


def test_truncated_stream_is_best_effort_and_flushes_the_key():
    ex = StreamExpander(KM)
    out = ex.feed('{"b":[{"a":"r1"},{"') + ex.feed("b") + ex.close()
    assert out == '{"customer_orders":[{"order_reference_code":"r1"},{"extracted_customer_name'
    assert ex.best_effort
    assert any("inside an object key" in p for p in ex.problems)


def test_malformed_closers_reported():
    text, problems = expand_text('{"a":"x"]]', KM)
    assert text == '{"extracted_customer_name":"x"]]'
    assert problems


def test_validate_minified_reports_parse_and_schema_errors():
    assert validate_minified('{"a":"x"}', MINIFIED) == []
    assert validate_minified('{"a":', MINIFIED)[0].startswith("output is not JSON")
    errors = validate_minified({"a": 1, "zz": 2}, MINIFIED)
    assert len(errors) == 2
    marker = best_effort_marker(errors)
    assert marker["code"] == SCHEMA_ERR == "S98_ALERT_SCHEMA_ERR" and marker["best_effort"]


def test_response_format_and_tool_arguments():
    rf = {"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": SCHEMA}}
    new_rf, km = minify_response_format(rf)
    assert new_rf["json_schema"]["schema"] == MINIFIED and new_rf["json_schema"]["strict"]
    assert rf["json_schema"]["schema"] is SCHEMA
    assert minify_response_format({"type": "json_object"}) is None

    tools = [{"type": "function", "function": {"name": "lookup_customer", "parameters": SCHEMA}},
             {"type": "function", "function": {"name": "noop", "parameters": {"type": "object"}}}]
    new_tools, maps = minify_tools(tools)
    assert set(maps) == {"lookup_customer"}
    assert new_tools[1] is tools[1]
    args = expand_tool_arguments('{"a":"Ann","b":[{"a":"r"}]}', maps["lookup_customer"])
    assert json.loads(args) == {"extracted_customer_name": "Ann",
                                "customer_orders": [{"order_reference_code": "r"}]}
