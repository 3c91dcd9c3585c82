"""Semantic aliases: a one-token word of the key itself, unique among its siblings, with
letters as the fallback; and the property that they round-trip with a real tokenizer."""
from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.core.minify import (MinifyOptions, StreamExpander, expand_json, minify_json,
                             minify_schema, rewrite_text, validate_minified)
from app.core.minify_alias import assign_aliases, key_words, semantic_candidates
from app.contract.tokenizers import get_counter
from tests.minify.strategies import chunked, instance, schemas

SEMANTIC = MinifyOptions(alias_style="semantic")
S = {"type": "string"}


def obj(**props):
    return {"type": "object", "properties": props, "additionalProperties": False}


def aliases(keys, tokenizer=None, patterns=()):
    counter = get_counter(tokenizer) if tokenizer else None
    return assign_aliases(list(keys), [re.compile(p) for p in patterns], counter, "semantic")


def test_key_words_split_snake_kebab_camel_digits_and_acronyms():
    assert key_words("extracted_customer_organization_department_name") == (
        "extracted", "customer", "organization", "department", "name")
    assert key_words("invoiceTotalAmountUsd") == ("invoice", "total", "amount", "usd")
    assert key_words("HTTPServer-port2name") == ("http", "server", "port", "name")
    assert key_words("line item 3 (net)") == ("line", "item", "net")


def test_candidates_prefer_specific_head_words():
    keys = ["extracted_customer_organization_department_name", "invoiceTotalAmountUsd"]
    assert semantic_candidates(keys[0], keys)[:3] == ["department", "dept", "organization"]
    assert semantic_candidates(keys[1], keys)[:2] == ["total", "invoice"]
    # the head noun of "X of Y" is X
    assert semantic_candidates("requested_modules_of_interest", [])[0] == "modules"


@pytest.mark.parametrize("tokenizer", ["cl100k_base", "o200k_base", "smollm2"])
def test_support_ticket_keys_get_words_the_model_can_use(tokenizer):
    got = aliases(["customer_full_name", "customer_email_address", "ticket_priority_level",
                   "affected_product_name", "requested_refund_flag"], tokenizer)
    # "customer" is shared with the e-mail key, but name/full are generic; the e-mail key
    # has its own specific word, so they do not fight over "customer".
    assert got["customer_full_name"] == "customer"
    assert got["customer_email_address"] == "email"
    assert got["ticket_priority_level"] == "priority"
    assert got["affected_product_name"] == "product"
    counter = get_counter(tokenizer)
    # "refund" is two tokens in SmolLM2, so that key takes its next word there
    assert got["requested_refund_flag"] == ("flag" if counter.count("refund") > 1 else "refund")
    assert all(counter.count(a) == 1 for a in got.values())


def test_colliding_words_among_siblings_stay_unique_then_fall_back_to_letters():
    keys = ["billing_address_city", "shipping_address_city", "home_address_city",
            "city_name_value", "city_name_text"]
    got = aliases(keys, "cl100k_base")
    assert got == {"billing_address_city": "billing", "shipping_address_city": "shipping",
                   "home_address_city": "home", "city_name_value": "city",
                   "city_name_text": "text"}
    keys = ["total_amount", "amount_total", "total_value_amount"]
    got = aliases(keys, "cl100k_base")
    assert got == {"total_amount": "total", "amount_total": "amount",
                   "total_value_amount": "value"}
    keys = ["customer_name", "name_customer", "customer__name", "customer-name"]
    assert aliases(keys, "cl100k_base") == {"customer_name": "customer",
                                            "name_customer": "name",
                                            "customer__name": "a", "customer-name": "b"}


def test_never_another_siblings_key_nor_a_pattern_match():
    # "customer" and "email" are real keys here, so the verbose keys may not use them
    got = aliases(["customer", "customer_email_address", "email", "customer_total"],
                  "cl100k_base", patterns=["^tot"])
    assert got["customer"] == "customer" and got["email"] == "email"
    assert got["customer_email_address"] == "address"
    assert got["customer_total"] == "a"  # total matches ^tot, customer is taken


def test_words_that_are_not_one_token_or_cost_more_in_context_are_skipped():
    counter = get_counter("smollm2")
    assert counter.count("competitor") > 1
    got = aliases(["mentioned_competitor_names"], "smollm2")
    assert got["mentioned_competitor_names"] != "competitor"
    for alias in got.values():
        for ctx in ('{"%s":', ',"%s":', ', "%s": '):
            assert counter.count(ctx % alias) <= counter.count(ctx % "a")


def test_semantic_schema_roundtrips_and_rewrites_instructions():
    schema = obj(customer_full_name=S, customer_email_address=S,
                 invoice_line_items={"type": "array", "items": obj(
                     line_item_description_text=S, line_item_net_total_amount={"type": "number"})})
    counter = get_counter("cl100k_base")
    minified, keymap = minify_schema(schema, tokenizer=counter, options=SEMANTIC)
    assert list(minified["properties"]) == ["customer", "email", "line"]
    assert list(minified["properties"]["line"]["items"]["properties"]) == ["description",
                                                                             "total"]
    value = {"customer_full_name": "customer", "customer_email_address": "email",
             "invoice_line_items": [{"line_item_description_text": "total",
                                     "line_item_net_total_amount": 3}]}
    small = minify_json(value, keymap)
    assert small == {"customer": "customer", "email": "email",
                     "line": [{"description": "total", "total": 3}]}
    assert validate_minified(small, minified) == []
    text = json.dumps(small)
    assert json.loads(expand_json(text, keymap)) == value
    ex = StreamExpander(keymap)
    assert json.loads("".join(ex.feed(c) for c in text) + ex.close()) == value
    assert rewrite_text("Fill customer_full_name and customer_email_address.", keymap) == (
        "Fill customer and email.")


def test_style_is_part_of_the_cache_key():
    schema = obj(customer_full_name=S)
    counter = get_counter("cl100k_base")
    _, letters = minify_schema(schema, tokenizer=counter)
    _, words = minify_schema(schema, tokenizer=counter, options=SEMANTIC)
    assert letters.renames == (("$", "customer_full_name", "a"),)
    assert words.renames == (("$", "customer_full_name", "customer"),)
    with pytest.raises(ValueError):
        MinifyOptions(alias_style="emoji")


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_semantic_aliases_with_a_real_tokenizer_roundtrip_and_are_one_token(data):
    counter = get_counter(data.draw(st.sampled_from(["cl100k_base", "o200k_base"])))
    schema = data.draw(schemas())
    value = data.draw(instance(schema))
    options = MinifyOptions(alias_style="semantic", minify_enums=data.draw(st.booleans()))
    minified, keymap = minify_schema(schema, tokenizer=counter, options=options)
    assert all(counter.count(a) == 1 for _, _, a in keymap.renames)
    small = minify_json(value, keymap)
    assert validate_minified(small, minified) == []
    assert expand_json(small, keymap) == value
    text = json.dumps(small, ensure_ascii=data.draw(st.booleans()))
    ex = StreamExpander(keymap)
    pieces = chunked(text, data.draw(st.lists(st.integers(0, 10_000), max_size=30)))
    out = "".join(ex.feed(p) for p in pieces) + ex.close()
    assert ex.problems == []
    assert json.loads(out) == value
