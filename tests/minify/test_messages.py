"""Mentions of schema keys in instructions are rewritten to the aliases, whole words only."""
from __future__ import annotations

from app.core.minify import minify_schema, rewrite_messages

S = {"type": "string"}
SCHEMA = {"type": "object", "properties": {
    "extracted_customer_name": S, "status": S, "customerTier": S,
    "order": {"type": "object", "properties": {"status": S, "order_total_amount": S}}}}
_, KM = minify_schema(SCHEMA)


def test_whole_words_only_and_inputs_untouched():
    messages = [{"role": "system", "content":
                 "Fill extracted_customer_name, not extracted_customer_name_2 or "
                 "my_extracted_customer_name; customerTier and order_total_amount too."},
                {"role": "tool", "content": "extracted_customer_name"}]
    out = rewrite_messages(messages, KM)
    assert out[0]["content"] == ("Fill a, not extracted_customer_name_2 or "
                                 "my_extracted_customer_name; c and b too.")
    assert out[1] is messages[1]
    assert messages[0]["content"].startswith("Fill extracted_customer_name,")


def test_plain_words_only_when_quoted_and_ambiguous_keys_left():
    # `status` is "b" at the root and "a" inside `order`: ambiguous, never rewritten.
    schema = {"type": "object", "properties": {"priority": S, "summary_text": S}}
    _, km = minify_schema(schema)
    out = rewrite_messages([{"role": "user", "content":
                             'Set "priority" and `priority`; priority matters. summary_text.'}], km)
    assert out[0]["content"] == 'Set "a" and `a`; priority matters. b.'
    text = rewrite_messages([{"role": "user", "content": 'the "status" field'}], KM)
    assert text[0]["content"] == 'the "status" field'


def test_content_parts():
    out = rewrite_messages([{"role": "user", "content": [
        {"type": "text", "text": "use extracted_customer_name"},
        {"type": "image_url", "image_url": {"url": "x"}}]}], KM)
    assert out[0]["content"][0]["text"] == "use a"
    assert out[0]["content"][1]["type"] == "image_url"


def test_legend_names_every_alias_per_location_and_enum_values():
    from app.core.minify import MinifyOptions, legend_text
    schema = {"type": "object", "properties": {
        "customer_full_name": {"type": "string"},
        "billing_postal_address": {"type": "object", "properties": {
            "postal_code_value": {"type": "string"}}},
        "ticket_priority_level": {"enum": ["HIGH_PRIORITY_SERVICE_DOWN", "LOW_ROUTINE"]}}}
    _, keymap = minify_schema(schema, options=MinifyOptions(minify_enums=True))
    assert legend_text(keymap).splitlines() == [
        "Answer keys: a = customer_full_name; b = billing_postal_address; "
        "c = ticket_priority_level.",
        "Answer keys inside billing_postal_address: a = postal_code_value.",
        'Values of ticket_priority_level: "a" = "HIGH_PRIORITY_SERVICE_DOWN"; '
        '"b" = "LOW_ROUTINE".']
