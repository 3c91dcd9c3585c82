"""Enum value minification: multi-token enum/const strings get one-token aliases only where
every schema at the location lists its values; strings anywhere else are never touched."""
from __future__ import annotations

import json

from app.core.minify import (MinifyOptions, StreamExpander, expand_json, minify_json,
                             minify_response_format, minify_schema, validate_minified)

ON = MinifyOptions(minify_enums=True)
S = {"type": "string"}
STATUS = {"type": "string", "description": "Workflow state",
          "enum": ["AWAITING_CUSTOMER_RESPONSE", "ESCALATED_TO_ENGINEERING", "a"]}


def obj(**props):
    return {"type": "object", "properties": props, "additionalProperties": False}


def stream(text, keymap, size=1):
    ex = StreamExpander(keymap)
    out = "".join(ex.feed(text[i:i + size]) for i in range(0, len(text), size)) + ex.close()
    return out, ex.problems


def roundtrip(schema, value, options=ON):
    minified, keymap = minify_schema(schema, options=options)
    small = minify_json(value, keymap)
    assert validate_minified(small, minified) == [], small
    assert expand_json(small, keymap) == value
    text = json.dumps(small, ensure_ascii=False)
    for size in (1, 3, len(text)):
        out, problems = stream(text, keymap, size)
        assert problems == [] and json.loads(out) == value
    return minified, keymap, small


def test_enum_values_aliased_at_closed_location_only():
    schema = obj(ticket_workflow_status=STATUS, agent_free_text_note=S,
                 status_or_free_text={"anyOf": [STATUS, S]})
    value = {"ticket_workflow_status": "ESCALATED_TO_ENGINEERING", "agent_free_text_note": "b",
             "status_or_free_text": "AWAITING_CUSTOMER_RESPONSE"}
    minified, keymap, small = roundtrip(schema, value)
    # "a" is a real value of the enum: never reused as an alias of another value
    assert minified["properties"]["a"]["enum"] == ["b", "c", "a"]
    assert small == {"a": "c", "b": "b", "c": "AWAITING_CUSTOMER_RESPONSE"}
    assert {(p, v) for p, v, _ in keymap.value_renames} == {
        ("$.ticket_workflow_status", "AWAITING_CUSTOMER_RESPONSE"),
        ("$.ticket_workflow_status", "ESCALATED_TO_ENGINEERING")}


def test_strings_that_look_like_value_aliases_elsewhere_are_untouched():
    schema = obj(ticket_workflow_status=STATUS, agent_free_text_note=S,
                 related_notes={"type": "array", "items": S})
    _, keymap = minify_schema(schema, options=ON)
    text = '{"a":"b","b":"c","c":["b","c","a"]}'
    expected = {"ticket_workflow_status": "AWAITING_CUSTOMER_RESPONSE",
                "agent_free_text_note": "c", "related_notes": ["b", "c", "a"]}
    assert json.loads(expand_json(text, keymap)) == expected
    assert expand_json(json.loads(text), keymap) == expected
    for size in (1, 2, 7):
        assert json.loads(stream(text, keymap, size)[0]) == expected


def test_off_by_default():
    minified, keymap, small = roundtrip(obj(ticket_workflow_status=STATUS),
                                        {"ticket_workflow_status": "ESCALATED_TO_ENGINEERING"},
                                        options=MinifyOptions())
    assert keymap.value_renames == ()
    assert small == {"a": "ESCALATED_TO_ENGINEERING"}
    assert minified["properties"]["a"]["enum"] == STATUS["enum"]


def test_legend_in_description_so_the_model_knows_each_value():
    minified, _ = minify_schema(obj(ticket_workflow_status=STATUS), options=ON)
    assert minified["properties"]["a"]["description"] == (
        'ticket_workflow_status: Workflow state (values: "b" = "AWAITING_CUSTOMER_RESPONSE", '
        '"c" = "ESCALATED_TO_ENGINEERING")')
    kept, _ = minify_schema(obj(ticket_workflow_status=STATUS),
                            options=MinifyOptions(describe="keep", minify_enums=True))
    assert kept["properties"]["a"]["description"].startswith("Workflow state (values: ")


def test_ref_defs_arrays_and_oneof_discriminators():
    schema = {
        "$defs": {"state": {"enum": ["PENDING_MANAGER_APPROVAL", "APPROVED_FOR_PAYMENT"]}},
        **obj(expense_line_states={"type": "array", "items": {"$ref": "#/$defs/state"}},
              settlement_instruction={"oneOf": [
                  obj(settlement_method_kind={"const": "DOMESTIC_BANK_TRANSFER"},
                      beneficiary_account_iban=S),
                  obj(settlement_method_kind={"const": "CORPORATE_CARD_REFUND"},
                      corporate_card_last_four=S)]})}
    value = {"expense_line_states": ["APPROVED_FOR_PAYMENT", "PENDING_MANAGER_APPROVAL"],
             "settlement_instruction": {"settlement_method_kind": "CORPORATE_CARD_REFUND",
                                        "corporate_card_last_four": "4242"}}
    minified, keymap, small = roundtrip(schema, value)
    assert small == {"a": ["b", "a"], "b": {"a": "b", "c": "4242"}}
    branches = minified["properties"]["b"]["oneOf"]
    assert [b["properties"]["a"]["const"] for b in branches] == ["a", "b"]


def test_locations_an_alias_could_break_are_left_alone():
    for extra in ({"pattern": "^[A-Z_]+$"}, {"minLength": 3}, {"format": "email"}):
        schema = obj(ticket_workflow_status={**STATUS, **extra})
        _, keymap = minify_schema(schema, options=ON)
        assert keymap.value_renames == ()
    # a `true` branch admits any string: not closed
    _, keymap = minify_schema(obj(status_any={"anyOf": [STATUS, True]}), options=ON)
    assert keymap.value_renames == ()


def test_original_value_written_by_the_model_passes_through():
    _, keymap = minify_schema(obj(ticket_workflow_status=STATUS), options=ON)
    text = '{"a":"ESCALATED_TO_ENGINEERING"}'
    assert json.loads(stream(text, keymap)[0]) == {
        "ticket_workflow_status": "ESCALATED_TO_ENGINEERING"}


def test_escaped_and_unicode_values():
    schema = obj(delivery_status_label={"enum": ['Zugestellt – "Briefkasten"', "Rücksendung\\n"]})
    roundtrip(schema, {"delivery_status_label": 'Zugestellt – "Briefkasten"'})
    _, keymap = minify_schema(schema, options=ON)
    small = minify_json({"delivery_status_label": "Rücksendung\\n"}, keymap)
    text = json.dumps(small)  # \\uXXXX escapes in the alias are decoded before lookup
    assert json.loads(stream(text.replace('"b"', '"\\u0062"'), keymap)[0]) == {
        "delivery_status_label": "Rücksendung\\n"}


def test_response_format_with_only_enum_values_to_shorten():
    from app.contract.tokenizers import get_counter
    cl100k = get_counter("cl100k_base")
    rf = {"type": "json_schema", "json_schema": {"name": "t", "schema": obj(
        status={"enum": ["AWAITING_CUSTOMER_RESPONSE", "ESCALATED_TO_ENGINEERING"]})}}
    # "status" is one cl100k token already: nothing to do unless values are minified
    assert minify_response_format(rf, tokenizer=cl100k) is None
    new_rf, keymap = minify_response_format(rf, tokenizer=cl100k, options=ON)
    assert new_rf["json_schema"]["schema"]["properties"]["status"]["enum"] == ["a", "b"]
    assert keymap.renames == () and len(keymap.value_renames) == 2


def test_a_dict_shared_in_python_maps_like_its_json_copy():
    from app.core.minify import clear_cache
    schema = obj(ticket_workflow_status=STATUS, status_or_free_text={"anyOf": [STATUS, S]})
    clear_cache()
    _, shared = minify_schema(schema, options=ON)
    clear_cache()
    _, copied = minify_schema(json.loads(json.dumps(schema)), options=ON)
    assert shared.value_renames == copied.value_renames != ()


def test_semantic_enum_aliases_are_a_word_only_that_value_has():
    """alias_style semantic: a value's alias is a word of it, read left to right (enum
    names lead with what tells them apart), and never a word another value shares, which
    would tell the model the wrong thing; such values get letters."""
    from app.contract.tokenizers import get_counter
    priority = {"type": "string", "enum": ["HIGH_PRIORITY_SERVICE_DOWN",
                                           "LOW_PRIORITY_ROUTINE_REQUEST"]}
    related = {"type": "string", "enum": ["NOT_RELATED", "UNLIKELY_RELATED", "RELATED"]}
    schema = obj(ticket_priority_level=priority, causality_assessment=related)
    options = MinifyOptions(minify_enums=True, alias_style="semantic")
    for tokenizer in ("cl100k_base", "smollm2"):
        _, keymap = minify_schema(schema, tokenizer=get_counter(tokenizer), options=options)
        got = {v: a for _, v, a in keymap.value_renames}
        assert got["HIGH_PRIORITY_SERVICE_DOWN"] == "high"
        assert got["LOW_PRIORITY_ROUTINE_REQUEST"] == "low"
        assert got["NOT_RELATED"] == "not"
        # "related" is in every value: no value gets it (RELATED itself, where it is more
        # than one token, gets a letter)
        assert got.get("UNLIKELY_RELATED") in ("unlikely", "a", "b", "c")
        assert "related" not in got.values()
        value = {"ticket_priority_level": "LOW_PRIORITY_ROUTINE_REQUEST",
                 "causality_assessment": "UNLIKELY_RELATED"}
        small = minify_json(value, keymap)
        assert expand_json(small, keymap) == value
        assert expand_json(json.dumps(small), keymap) == json.dumps(value)
