"""Which policy fields are part of a cache key: the ones that can change the answer to the
request at hand. Editing a routing, budget, lookup or learning field keeps a tenant's
cached answers (before, any edit orphaned the whole cache: a replayed month's carried-over
hits were lost to a change of exploration or of the warm-up)."""
from __future__ import annotations

import pytest

from app.contract.cache.keys import build_key
from app.contract.policy import ANSWER_FIELDS, DEFAULTS, FIELDS, ROUTING_FIELDS

ASK = [{"role": "user", "content": "Extract the total of invoice INV-2231"}]
SCHEMA = {"type": "json_schema", "json_schema": {"name": "inv", "schema": {
    "type": "object", "properties": {"total": {"type": "number"}}}}}
TOOLS = [{"type": "function", "function": {"name": "lookup_invoice", "parameters": {
    "type": "object", "properties": {"id": {"type": "string"}}}}}]
# a value other than the default, per field kind
OTHER = {bool: lambda v: not v, int: lambda v: v + 1, float: lambda v: v / 2 if v else 0.5,
         str: lambda v: v + "x", "tiers": lambda v: ["tier-1"]}


def _changed(name: str) -> dict:
    f = FIELDS[name]
    value = f.choices[1] if f.choices and f.choices[0] == f.default else \
        (f.choices[0] if f.choices else OTHER[f.kind](f.default))
    assert value != f.default
    return {**DEFAULTS, name: value}


def _key(policy, **kw):
    return build_key("t1", policy, "auto", {"messages": ASK, "temperature": 0, **kw})


def test_every_field_is_declared_answer_shaping_or_routing():
    answer = {f for fields in ANSWER_FIELDS.values() for f in fields}
    assert not answer & ROUTING_FIELDS
    assert answer | ROUTING_FIELDS == set(FIELDS), \
        "classify a new policy field: can it change an answer (ANSWER_FIELDS) or not?"


@pytest.mark.parametrize("name", sorted(ROUTING_FIELDS))
def test_a_routing_field_edit_keeps_every_key(name):
    for kw in ({}, {"response_format": SCHEMA}, {"tools": TOOLS}):
        before, after = _key(DEFAULTS, **kw), _key(_changed(name), **kw)
        assert (after.exact_hash, after.composite) == (before.exact_hash, before.composite)


@pytest.mark.parametrize("name", sorted({f for fs in ANSWER_FIELDS.values() for f in fs}))
def test_an_answer_field_edit_changes_the_keys_it_acts_on(name):
    for kind, kw in (("any", {}), ("schema", {"response_format": SCHEMA}),
                     ("tools", {"tools": TOOLS})):
        before, after = _key(DEFAULTS, **kw), _key(_changed(name), **kw)
        acts = name in ANSWER_FIELDS["any"] or name in ANSWER_FIELDS[kind]
        # exact and semantic alike: a changed answer is never served from either
        assert (after.exact_hash != before.exact_hash) is acts, (name, kind)
        assert (after.composite != before.composite) is acts, (name, kind)


def test_a_field_outside_the_declared_ones_counts_as_answer_shaping():
    assert _key({**DEFAULTS, "something_new": 1}).exact_hash != _key(DEFAULTS).exact_hash
