"""Compact separators (app.core.minify_compact): the grammar S02 sends a pool accepts the
minified answer written with "," and ":" and nothing looser, for every schema of the
bench corpus; ``respace`` restores the separators the engine would otherwise write,
exactly, without touching strings."""
from __future__ import annotations

import json
import pathlib

import pytest
import xgrammar as xgr
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.minify import MinifyOptions, minify_json, minify_response_format
from app.core.minify_compact import STYLE_HINT, compact_grammar, respace, with_style_hint
from app.contract.tokenizers import get_counter

CORPUS = pathlib.Path(__file__).parents[2] / "bench" / "data" / "minify_corpus.jsonl"
CASES = [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"])),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)


def _accepts(grammar: str, text: str) -> bool:
    return xgr.testing._is_grammar_accept_string(xgr.Grammar.from_ebnf(grammar), text)


@pytest.mark.parametrize("case", CASES, ids=[c.get("name", str(i)) for i, c in enumerate(CASES)])
def test_grammar_accepts_the_compact_minified_answer_only(case):
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": case["schema"]}}
    rf, keymap = minify_response_format(fmt, tokenizer=get_counter("cl100k_base"),
                                        options=MinifyOptions(alias_style="semantic"))
    schema = rf["json_schema"]["schema"]
    grammar = compact_grammar(schema)
    assert grammar is not None
    mini = minify_json(case["output"], keymap)
    compact = json.dumps(mini, ensure_ascii=False, separators=(",", ":"))
    assert _accepts(grammar, compact)
    assert not _accepts(grammar, json.dumps(mini, ensure_ascii=False))   # ", " and ": "
    assert compact_grammar(json.loads(json.dumps(schema))) is grammar     # cached per schema


def test_grammar_none_for_a_schema_xgrammar_cannot_take():
    assert compact_grammar({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}},
                            "required": ["a"]}) is None


@settings(max_examples=300, deadline=None)
@given(json_values, st.booleans())
def test_respace_gives_the_default_separators_and_keeps_strings(value, ascii_only):
    compact = json.dumps(value, separators=(",", ":"), ensure_ascii=ascii_only)
    spaced = respace(compact)
    assert spaced == json.dumps(value, ensure_ascii=ascii_only)
    assert respace(spaced) == spaced                      # already spaced: unchanged
    assert respace(compact, (",", ":")) == compact        # compact target: nothing added


def test_respace_is_lexical_on_text_that_is_not_json():
    assert respace('{"a":"x\\",y:z","b":[1,2') == '{"a": "x\\",y:z", "b": [1, 2'
    assert respace("") == ""


def test_ledger_raw_equivalent_credits_keys_not_separators_on_a_compact_answer():
    """S05's savings on a compact answer: the keys' saving counted with both texts spaced,
    so the raw equivalent never credits separators the model may not have saved."""
    from types import SimpleNamespace

    from app.gateway.stages.s02_minify import MinifyState
    from app.gateway.stages.s05_expand import _savings
    from app.contract.tokenizers import count_tokens
    minified = '{"customer":"Ada Lovelace","total":12}'
    expanded = '{"customer_full_name":"Ada Lovelace","invoice_total_amount":12}'
    got = {}
    for compact in (False, True):
        state = MinifyState(keymap=object(), schema={}, tokenizer="cl100k_base",
                            compact=compact)
        ctx = SimpleNamespace(minify=state,
                              usage={"completion_tokens": 20}, telemetry={}, request_id="r")
        _savings(ctx, minified, expanded)
        got[compact] = ctx.telemetry["minify"]["raw_schema_output_tokens_equivalent"]
    keys_spaced = (count_tokens(respace(expanded), "cl100k_base")
                   - count_tokens(respace(minified), "cl100k_base"))
    assert got[True] == 20 + keys_spaced
    assert got[False] == 20 + count_tokens(expanded, "cl100k_base") - count_tokens(minified,
                                                                                   "cl100k_base")


def test_style_hint_joins_the_first_system_message_or_comes_first():
    user = {"role": "user", "content": "hi"}
    got = with_style_hint([{"role": "system", "content": "Extract."}, user])
    assert got == [{"role": "system", "content": f"Extract.\n{STYLE_HINT}"}, user]
    parts = [{"type": "text", "text": "Extract."}]
    got = with_style_hint([{"role": "developer", "content": parts}, user])
    assert got[0]["content"] == [*parts, {"type": "text", "text": "\n" + STYLE_HINT}]
    assert parts == [{"type": "text", "text": "Extract."}]  # the input is not changed
    assert with_style_hint([user]) == [{"role": "system", "content": STYLE_HINT}, user]
    # the hint's own object is compact JSON: the style it shows
    shown = STYLE_HINT[STYLE_HINT.index("{"):]
    assert json.dumps(json.loads(shown), separators=(",", ":")) == shown
