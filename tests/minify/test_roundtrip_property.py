"""Random schemas and valid objects round-trip exactly through minify -> expand, whole and
streamed at random chunk boundaries (one character at a time included), with and
without enum value minification, with letter and with semantic (word) aliases."""
from __future__ import annotations

import json

import jsonschema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.core.minify import (ALIAS_STYLES, MinifyOptions, StreamExpander, expand_json,
                             minify_json, minify_schema, validate_minified)
from tests.minify.strategies import chunked, instance, keys, schemas, string_values

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _stream(keymap, pieces: list[str]) -> tuple[str, list[str]]:
    ex = StreamExpander(keymap)
    out = "".join(ex.feed(p) for p in pieces) + ex.close()
    return out, ex.problems


def _options(data) -> MinifyOptions:
    return MinifyOptions(minify_enums=data.draw(st.booleans(), label="minify_enums"),
                         alias_style=data.draw(st.sampled_from(ALIAS_STYLES),
                                               label="alias_style"))


def _serialise(obj, style: int) -> str:
    if style == 0:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    if style == 1:
        return json.dumps(obj)  # \uXXXX escapes, surrogate pairs for astral characters
    return json.dumps(obj, indent=2, ensure_ascii=False)


@SETTINGS
@given(data=st.data())
def test_random_schema_roundtrips_whole_and_streamed(data):
    schema = data.draw(schemas())
    obj = data.draw(instance(schema))
    jsonschema.validate(obj, schema)
    minified, keymap = minify_schema(schema, options=_options(data))
    small = minify_json(obj, keymap)
    assert validate_minified(small, minified) == []
    assert expand_json(small, keymap) == obj

    text = _serialise(small, data.draw(st.integers(0, 2)))
    assert json.loads(expand_json(text, keymap)) == obj
    cuts = data.draw(st.lists(st.integers(0, 10_000), max_size=30))
    out, problems = _stream(keymap, chunked(text, cuts))
    assert problems == []
    assert json.loads(out) == obj


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_one_character_at_a_time(data):
    schema = data.draw(schemas())
    obj = data.draw(instance(schema))
    _, keymap = minify_schema(schema, options=_options(data))
    text = _serialise(minify_json(obj, keymap), data.draw(st.integers(0, 2)))
    out, problems = _stream(keymap, list(text))
    assert problems == []
    assert json.loads(out) == obj
    # Streaming changes nothing but keys: the same text as the whole-response expansion.
    assert out == expand_json(text, keymap)


@SETTINGS
@given(data=st.data())
def test_minify_is_deterministic_per_schema(data):
    from app.core.minify import clear_cache
    schema = data.draw(schemas())
    options = _options(data)
    first = minify_schema(schema, options=options)
    clear_cache()
    again = minify_schema(json.loads(json.dumps(schema)), options=options)
    assert first[0] == again[0]
    assert first[1].renames == again[1].renames
    assert first[1].value_renames == again[1].value_renames


@SETTINGS
@given(data=st.data())
def test_stream_output_only_grows_and_holds_back_at_most_one_key(data):
    schema = data.draw(schemas())
    obj = data.draw(instance(schema))
    _, keymap = minify_schema(schema, options=_options(data))
    text = json.dumps(minify_json(obj, keymap), ensure_ascii=data.draw(st.booleans()))
    final = expand_json(text, keymap)
    pieces = chunked(text, data.draw(st.lists(st.integers(0, 10_000), max_size=30)))
    ex = StreamExpander(keymap)
    emitted = ""
    consumed = ""
    for piece in pieces:
        emitted += ex.feed(piece)
        consumed += piece
        assert final.startswith(emitted)
        if ex.holding:  # only the inside of the unfinished key (or enum value) is held
            assert emitted.endswith('"')
        else:  # everything fed so far is out
            assert emitted[-1:] == consumed[-1:]
    assert emitted + ex.close() == final


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), string_values),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(keys, inner, max_size=4)),
    max_leaves=12)


@SETTINGS
@given(data=st.data())
def test_whole_text_fast_path_equals_the_streaming_scanner_on_any_json(data):
    """Any valid JSON, in or out of the schema (aliases in the wrong place included): the
    whole-response path gives the scanner's text and problems."""
    from app.core.minify import expand_text
    _, keymap = minify_schema(data.draw(schemas()), options=_options(data))
    text = _serialise(data.draw(json_values), data.draw(st.integers(0, 2)))
    ex = StreamExpander(keymap)
    scanned = ex.feed(text) + ex.close()
    assert expand_text(text, keymap) == (scanned, ex.problems)
