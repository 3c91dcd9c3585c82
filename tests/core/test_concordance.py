import math

import pytest

from app.core.concordance import (JSON_FIELDS, TEXT_F1, concordance, json_field_match,
                                  normalize_text, sample_match, same_value, text_match,
                                  token_f1, wilson)


def test_wilson_matches_the_textbook_interval():
    low, high = wilson(8, 10)
    # Wilson 95% for 8/10: 0.4902 .. 0.9433
    assert math.isclose(low, 0.4902, abs_tol=1e-4)
    assert math.isclose(high, 0.9433, abs_tol=1e-4)


def test_wilson_edges_stay_inside_zero_one():
    assert wilson(0, 0) == (0.0, 1.0)
    low, high = wilson(0, 20)
    assert low == 0.0 and 0 < high < 0.2
    low, high = wilson(20, 20)
    assert 0.8 < low < 1.0 and high == 1.0


def test_json_fields_ignore_key_order_and_whitespace():
    ref = '{"order_id":"A123","qty":3,"item":"blue widget","customer":"Alice"}'
    cand = '{\n  "customer": "Alice", "item": "blue widget",\n "qty": 3, "order_id": "A123"}'
    assert json_field_match(ref, cand) == (1.0, True)


def test_json_fields_score_the_share_of_equal_fields():
    ref = '{"order_id":"A123","qty":3,"item":"blue widget","customer":"Alice"}'
    assert json_field_match(ref, '{"order_id":"A123","qty":4,"item":"blue widget"}') \
        == (0.5, False)
    # an extra field is not a match even when every reference field is right
    score, match = json_field_match(ref, ref[:-1] + ',"note":"x"}')
    assert score == 1.0 and not match


def test_json_fields_unparseable_or_wrong_shape_scores_zero():
    ref = '{"a": 1}'
    assert json_field_match(ref, "sure! here is the JSON: {a: 1}") == (0.0, False)
    assert json_field_match(ref, "[1]") == (0.0, False)
    assert json_field_match("[1, 2]", "[1,2]") == (1.0, True)
    assert json_field_match("not json", " not json ") == (1.0, True)


def test_booleans_never_equal_numbers():
    assert not same_value(True, 1)
    assert same_value(3, 3.0)
    assert json_field_match('{"ok": true}', '{"ok": 1}') == (0.0, False)
    assert same_value({"a": [1, {"b": None}]}, {"a": [1, {"b": None}]})


def test_text_metric_normalizes_then_uses_f1():
    assert normalize_text("The  Answer, is: 42!") == "answer is 42"
    assert text_match("The answer is 42.", "answer is 42") == (1.0, True)
    f1 = token_f1("the cat sat on the mat today", "the cat sat on a mat")
    assert 0.8 <= f1 < 1.0
    assert text_match("the cat sat on the mat today", "the cat sat on a mat")[1]
    f1, match = text_match("paris is the capital of france", "berlin")
    assert f1 == 0.0 and not match
    assert token_f1("", "") == 1.0 and token_f1("a b", "") == 0.0


def test_sample_match_dispatches_and_rejects_unknown_metrics():
    assert sample_match('{"a":1}', '{"a": 1}', JSON_FIELDS) == (1.0, True)
    assert sample_match("yes", "Yes.", TEXT_F1) == (1.0, True)
    with pytest.raises(ValueError):
        sample_match("a", "a", "bleu")


def test_concordance_summary():
    out = concordance([True, True, False, True])
    assert out["n"] == 4 and out["concordance"] == 0.75
    assert out["ci_low"] < 0.75 < out["ci_high"]
    assert concordance([]) == {"n": 0, "concordance": 0.0, "ci_low": 0.0, "ci_high": 1.0}
