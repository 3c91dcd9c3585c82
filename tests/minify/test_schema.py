"""Each schema construct is minified so that a model following the minified schema writes
output that expands back to the client's keys."""
from __future__ import annotations

import json

import pytest

from app.core.minify import (MinifyOptions, expand_json, minify_json, minify_schema,
                             schema_hash, validate_minified)


def roundtrip(schema, obj):
    minified, keymap = minify_schema(schema)
    small = minify_json(obj, keymap)
    assert validate_minified(small, minified) == [], small
    assert expand_json(small, keymap) == obj
    assert json.loads(expand_json(json.dumps(small), keymap)) == obj
    return minified, keymap, small


def obj(**props):
    return {"type": "object", "properties": props, "additionalProperties": False}


S = {"type": "string"}


def test_nested_objects_renamed_with_required():
    schema = obj(customer_account_record=obj(customer_display_name=S, customer_tax_id=S))
    schema["required"] = ["customer_account_record"]
    schema["properties"]["customer_account_record"]["required"] = ["customer_tax_id"]
    minified, _, small = roundtrip(schema, {"customer_account_record": {
        "customer_display_name": "Acme", "customer_tax_id": "DE123"}})
    assert small == {"a": {"a": "Acme", "b": "DE123"}}
    assert minified["required"] == ["a"]
    assert minified["properties"]["a"]["required"] == ["b"]


def test_arrays_of_objects_and_properties_under_items():
    schema = obj(invoice_line_items={"type": "array", "items": obj(
        line_item_description=S, line_item_amount={"type": "number"})})
    _, _, small = roundtrip(schema, {"invoice_line_items": [
        {"line_item_description": "bolts", "line_item_amount": 3.5},
        {"line_item_description": "nuts", "line_item_amount": 1}]})
    assert small == {"a": [{"a": "bolts", "b": 3.5}, {"a": "nuts", "b": 1}]}


def test_defs_and_ref_shared_by_two_properties():
    schema = obj(shipping_postal_address={"$ref": "#/$defs/postal_address"},
                 billing_postal_address={"$ref": "#/$defs/postal_address"})
    schema["$defs"] = {"postal_address": obj(street_address_line=S, postal_code_value=S)}
    minified, _, small = roundtrip(schema, {
        "shipping_postal_address": {"street_address_line": "1 Main St"},
        "billing_postal_address": {"postal_code_value": "10115"}})
    assert set(minified["$defs"]["postal_address"]["properties"]) == {"a", "b"}
    assert small == {"a": {"a": "1 Main St"}, "b": {"b": "10115"}}


def test_legacy_definitions_and_ref_into_properties():
    schema = obj(primary_contact_person=obj(contact_full_name=S),
                 secondary_contact_person={"$ref": "#/properties/primary_contact_person"})
    schema["definitions"] = {"unused_definition": obj(unused_long_field=S)}
    minified, _, small = roundtrip(schema, {"secondary_contact_person": {
        "contact_full_name": "Bo"}})
    assert minified["properties"]["b"]["$ref"] == "#/properties/a"
    assert small == {"b": {"a": "Bo"}}
    assert list(minified["definitions"]["unused_definition"]["properties"]) == ["a"]


def test_recursive_ref():
    schema = {"$ref": "#/$defs/org_unit", "$defs": {"org_unit": obj(
        org_unit_name=S, child_org_units={"type": "array", "items": {"$ref": "#/$defs/org_unit"}})}}
    tree = {"org_unit_name": "root", "child_org_units": [
        {"org_unit_name": "a", "child_org_units": [{"org_unit_name": "b"}]}]}
    _, _, small = roundtrip(schema, tree)
    assert small == {"a": "root", "b": [{"a": "a", "b": [{"a": "b"}]}]}


@pytest.mark.parametrize("combinator", ["anyOf", "oneOf"])
def test_branches_share_one_namespace(combinator):
    # Both branches have `name`; the expander cannot know the branch, so keys of all
    # branches at one location get distinct aliases (same key -> same alias).
    schema = {combinator: [obj(kind_of_party=S, person_given_name=S),
                           obj(kind_of_party=S, company_legal_name=S)]}
    _, keymap, small = roundtrip(schema, {"kind_of_party": "company",
                                          "company_legal_name": "Acme GmbH"})
    aliases = {o: a for _, o, a in keymap.renames}
    assert len(set(aliases.values())) == 3
    assert small == {aliases["kind_of_party"]: "company", aliases["company_legal_name"]: "Acme GmbH"}


def test_allof_merges_properties():
    schema = {"allOf": [{"$ref": "#/$defs/audit_fields"}, obj(ticket_subject_line=S)],
              "$defs": {"audit_fields": {"type": "object", "properties": {"created_by_user": S}}}}
    schema["allOf"][1].pop("additionalProperties")
    roundtrip(schema, {"created_by_user": "ann", "ticket_subject_line": "VPN down"})


def test_same_key_in_different_objects_collides_safely():
    # `customer_name` is alias "a" in one object and "b" in the other; alias "a" means
    # different keys in the two objects: the expander follows the structure.
    schema = obj(customer_name=S, order_record=obj(order_identifier=S, customer_name=S))
    _, keymap, small = roundtrip(schema, {"customer_name": "x", "order_record": {
        "order_identifier": "o-1", "customer_name": "y"}})
    assert small == {"a": "x", "b": {"a": "o-1", "b": "y"}}
    assert "a" in keymap.ambiguous


def test_additional_properties_schema_values_are_minified():
    schema = {"type": "object", "additionalProperties": obj(metric_value_amount={"type": "number"})}
    _, _, small = roundtrip(schema, {"cpu": {"metric_value_amount": 1.5}})
    assert small == {"cpu": {"a": 1.5}}


def test_pattern_properties_keys_left_alone_and_aliases_avoid_patterns():
    schema = {"type": "object", "properties": {"report_generated_at": S},
              "patternProperties": {"^[a-c]$": obj(nested_counter_value={"type": "integer"})}}
    minified, keymap, small = roundtrip(schema, {"report_generated_at": "now",
                                                 "b": {"nested_counter_value": 2}})
    alias = keymap.alias_of("$", "report_generated_at")
    assert alias not in ("a", "b", "c")
    assert small == {alias: "now", "b": {"a": 2}}
    assert list(minified["patternProperties"]) == ["^[a-c]$"]


def test_enum_const_default_objects_follow_the_renaming():
    schema = obj(shipping_option_choice={"enum": [{"carrier_name": "DHL"}, "none"]},
                 fixed_marker_object={"const": {"carrier_name": "UPS"},
                                      "properties": {"carrier_name": S}})
    schema["properties"]["shipping_option_choice"]["properties"] = {"carrier_name": S}
    minified, _, _ = roundtrip(schema, {"shipping_option_choice": {"carrier_name": "DHL"},
                                        "fixed_marker_object": {"carrier_name": "UPS"}})
    assert minified["properties"]["a"]["enum"] == [{"a": "DHL"}, "none"]
    assert minified["properties"]["b"]["const"] == {"a": "UPS"}


def test_description_prefix_and_keep_options():
    schema = obj(extracted_customer_name={"type": "string", "description": "Legal name"},
                 customer_segment_code=S, customer_flag=True)
    minified, _ = minify_schema(schema)
    props = minified["properties"]
    assert props["a"]["description"] == "extracted_customer_name: Legal name"
    assert props["b"]["description"] == "customer_segment_code"
    assert props["c"] == {"description": "customer_flag"}
    kept, _ = minify_schema(schema, options=MinifyOptions(describe="keep"))
    assert kept["properties"]["a"]["description"] == "Legal name"
    assert "description" not in kept["properties"]["b"]


def test_short_keys_kept_and_never_shadowed():
    schema = obj(id=S, a=S, customer_lifetime_value={"type": "number"})
    _, keymap, small = roundtrip(schema, {"id": "1", "a": "x", "customer_lifetime_value": 9})
    assert small == {"id": "1", "a": "x", "b": 9}  # "a" is taken by the real key


def test_deterministic_cached_and_returns_fresh_copies():
    schema = obj(long_field_name_one=S, long_field_name_two=S)
    m1, k1 = minify_schema(schema)
    m1["properties"]["a"]["type"] = "mutated"
    m2, k2 = minify_schema(json.loads(json.dumps(schema)))
    assert k1 is k2  # cache hit by content hash
    assert m2["properties"]["a"]["type"] == "string"
    reordered = obj(long_field_name_two=S, long_field_name_one=S)
    assert schema_hash(reordered) != schema_hash(schema)


def test_input_schema_not_mutated():
    schema = obj(some_long_property=S)
    before = json.dumps(schema)
    minify_schema(schema)
    assert json.dumps(schema) == before


def test_tokenizer_candidates_are_single_tokens():
    from app.contract.tokenizers import get_counter
    counter = get_counter("cl100k_base")
    schema = obj(**{f"field_number_{i}_description": S for i in range(60)})
    _, keymap = minify_schema(schema, tokenizer=counter)
    assert keymap.tokenizer == "cl100k_base"
    aliases = [a for _, _, a in keymap.renames]
    assert len(set(aliases)) == 60
    assert all(counter.count(a) == 1 for a in aliases)


def test_root_array_and_prefix_items():
    schema = {"type": "array", "items": obj(
        shipment_tracking_code=S,
        package_dimensions={"type": "array", "prefixItems": [
            obj(length_in_centimeters={"type": "number"}), obj(weight_in_kilograms={"type": "number"})]})}
    _, _, small = roundtrip(schema, [{"shipment_tracking_code": "1Z",
                                      "package_dimensions": [{"length_in_centimeters": 3},
                                                             {"weight_in_kilograms": 2}]}])
    # prefixItems share one location: their keys get distinct aliases
    assert small == [{"a": "1Z", "b": [{"a": 3}, {"b": 2}]}]


def test_keys_already_one_token_are_kept_with_a_real_tokenizer():
    from app.contract.tokenizers import get_counter
    counter = get_counter("cl100k_base")
    schema = obj(status=S, extracted_customer_name=S)
    _, keymap = minify_schema(schema, tokenizer=counter)
    assert keymap.renames == (("$", "extracted_customer_name", "a"),)
    assert minify_json({"status": "x", "extracted_customer_name": "y"}, keymap) == {
        "status": "x", "a": "y"}


@pytest.mark.parametrize("free_form", [
    {"type": "object"},                                   # declares nothing, forbids nothing
    {"type": "object", "additionalProperties": True},
    {"type": "object", "properties": {"source_system_name": S}, "additionalProperties": True},
])
def test_keys_of_a_free_form_object_are_the_clients_even_when_spelt_like_aliases(free_form):
    """A semantic alias is a real word ("email"); inside an object that takes any key, the
    same word is the client's own key and must come back as written, whole and streamed."""
    from app.core.minify import StreamExpander, expand_text
    schema = obj(customer_email_address=S, request_metadata=free_form)
    _, keymap = minify_schema(schema, options=MinifyOptions(alias_style="semantic"))
    alias = keymap.alias_of("$", "customer_email_address")
    assert alias is not None and alias != "customer_email_address"
    small = {alias: "x@example.com", keymap.alias_of("$", "request_metadata")
             or "request_metadata": {alias: "free", "a": 1}}
    want = {"customer_email_address": "x@example.com",
            "request_metadata": {alias: "free", "a": 1}}
    assert expand_json(small, keymap) == want
    text = json.dumps(small)
    ex = StreamExpander(keymap)
    streamed = "".join(ex.feed(ch) for ch in text) + ex.close()
    assert json.loads(streamed) == want and not ex.problems
    whole, problems = expand_text(text, keymap)
    assert json.loads(whole) == want and not problems
