"""Datasets in the form tier 1 is served in (``app.adapters.served_form``): S02's aliases in
the schema, the instructions and the answer, the style hint where a pool gets the compact
grammar, and the client's form kept where S02 would not minify."""
from __future__ import annotations

import json

from app.adapters.served_form import to_served
from app.contract.policy import DEFAULTS
from app.contract.tokenizers import SMOLLM2
from app.core.minify import expand_text

KEYS = ("supplier_invoice_reference_number", "supplier_legal_entity_name", "total_amount_due")
RF = {"type": "json_schema", "json_schema": {"name": "invoice", "strict": True, "schema": {
    "type": "object", "additionalProperties": False, "required": list(KEYS),
    "properties": {"supplier_invoice_reference_number": {"type": "string"},
                   "supplier_legal_entity_name": {"type": "string"},
                   "total_amount_due": {"type": "number"}}}}}
ANSWER = {"supplier_invoice_reference_number": "INV-64903",
          "supplier_legal_entity_name": "Porto Logistics", "total_amount_due": 5685.34}
RECORD = {"request_id": "r1", "split": "train", "response_format": RF,
          "answer": json.dumps(ANSWER),
          "messages": [{"role": "system", "content": "Return supplier_legal_entity_name and "
                                                     "the other fields as JSON."},
                       {"role": "user", "content": "INVOICE INV-64903 from Porto Logistics"}]}


def test_a_schema_trace_is_frozen_with_the_aliases_tier_one_writes():
    policy = dict(DEFAULTS)
    served = to_served(RECORD, policy, SMOLLM2)
    aliases = served["served_form"]["aliases"]
    assert set(aliases) == set(KEYS) and served["served_form"]["compact"] is True
    props = served["response_format"]["json_schema"]["schema"]["properties"]
    assert list(props) == [aliases[k] for k in KEYS]
    got = json.loads(served["answer"])
    assert list(got) == [aliases[k] for k in KEYS]
    assert list(got.values()) == list(ANSWER.values())
    assert " " not in served["answer"].replace("Porto Logistics", "")   # compact separators
    # the instructions name the alias and carry the compact style hint, as S02 sends them
    system = served["messages"][0]["content"]
    assert "supplier_legal_entity_name" not in system and aliases[KEYS[1]] in system
    assert system.count("\n") == 1 and served["messages"][1] == RECORD["messages"][1]
    # expanding the served answer with the same schema gives the client's answer back
    from app.core.minify import MinifyOptions, minify_response_format
    from app.contract.tokenizers import get_counter
    _, keymap = minify_response_format(RF, tokenizer=get_counter(SMOLLM2),
                                       options=MinifyOptions(alias_style="semantic"))
    assert json.loads(expand_text(served["answer"], keymap)[0]) == ANSWER


def test_without_the_grammar_no_style_hint_and_off_or_unminifiable_left_as_is():
    policy = dict(DEFAULTS)
    plain = to_served(RECORD, {**policy, "minify_compact_json": False}, SMOLLM2)
    assert plain["served_form"]["compact"] is False
    assert plain["messages"][0]["content"].count("\n") == 0
    assert to_served(RECORD, {**policy, "minify_enabled": False}, SMOLLM2) is RECORD
    as_object = {**RECORD, "response_format": {"type": "json_object"}}
    assert to_served(as_object, policy, SMOLLM2) is as_object
    not_json = {**RECORD, "answer": "sorry, no invoice here"}
    assert to_served(not_json, policy, SMOLLM2) is not_json
