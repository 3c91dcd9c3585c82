"""Concordance of a candidate answer with a reference answer, and its confidence. Pure.

Two metrics, chosen per sample by whether the request asked for JSON:

- ``json_fields``: both answers are parsed with ``json.loads``; the score is the share of
  the reference's top-level fields whose value the candidate has, equal after parsing
  (so key order and whitespace do not count). The sample matches when every field is
  equal and the candidate has no extra field. A reference that is not a JSON object is
  compared as a whole value; an unparseable candidate scores 0.
- ``text_f1``: the sample matches when the normalized texts are equal (lower case,
  punctuation and articles dropped, whitespace collapsed, as in SQuAD) or when their
  token-level F1 is at least ``F1_MATCH`` (0.8); the score is the F1.

Concordance over samples is the share that match, with a Wilson score interval.
"""
from __future__ import annotations

import json
import math
import re
import string
from collections import Counter
from typing import Any, Iterable

JSON_FIELDS, TEXT_F1 = "json_fields", "text_f1"
F1_MATCH = 0.8
Z_95 = 1.959963984540054

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def wilson(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval of a proportion; (0.0, 1.0) when there are no samples."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def _loads(text: str) -> tuple[bool, Any]:
    try:
        return True, json.loads(text)
    except (TypeError, ValueError):
        return False, None


def same_value(a: Any, b: Any) -> bool:
    """JSON values equal as parsed, except that a boolean never equals a number
    (``True == 1`` in Python, not in JSON)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(v, b[k]) for k, v in a.items())
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    return type(a) in (int, float) and type(b) in (int, float) and a == b \
        or type(a) is type(b) and a == b


def json_field_match(reference: str, candidate: str) -> tuple[float, bool]:
    """(share of the reference's fields the candidate got equal, all equal and no extra
    field). A reference that is not JSON is compared as stripped text."""
    ok_ref, ref = _loads(reference)
    if not ok_ref:
        equal = reference.strip() == candidate.strip()
        return float(equal), equal
    ok_cand, cand = _loads(candidate)
    if not ok_cand:
        return 0.0, False
    if not isinstance(ref, dict):
        equal = same_value(ref, cand)
        return float(equal), equal
    if not isinstance(cand, dict):
        return 0.0, False
    if not ref:
        return float(not cand), not cand
    same = sum(1 for k, v in ref.items() if k in cand and same_value(v, cand[k]))
    return same / len(ref), same == len(ref) and len(cand) == len(ref)


def normalize_text(text: str) -> str:
    text = text.lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def token_f1(reference: str, candidate: str) -> float:
    """F1 of the normalized tokens (a bag of words); 1.0 when both are empty."""
    ref, cand = normalize_text(reference).split(), normalize_text(candidate).split()
    if not ref or not cand:
        return float(ref == cand)
    common = sum((Counter(ref) & Counter(cand)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(cand), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def text_match(reference: str, candidate: str) -> tuple[float, bool]:
    """(token F1, normalized exact match or F1 >= F1_MATCH)."""
    f1 = token_f1(reference, candidate)
    return f1, normalize_text(reference) == normalize_text(candidate) or f1 >= F1_MATCH


def sample_match(reference: str, candidate: str, metric: str) -> tuple[float, bool]:
    """(score, match) of one sample under ``metric`` (JSON_FIELDS or TEXT_F1)."""
    if metric == JSON_FIELDS:
        return json_field_match(reference, candidate)
    if metric == TEXT_F1:
        return text_match(reference, candidate)
    raise ValueError(f"unknown concordance metric {metric!r}")


def concordance(matches: Iterable[bool]) -> dict[str, float | int]:
    """{n, concordance, ci_low, ci_high} of a list of per-sample matches."""
    flags = list(matches)
    n, k = len(flags), sum(1 for m in flags if m)
    low, high = wilson(k, n)
    return {"n": n, "concordance": k / n if n else 0.0, "ci_low": low, "ci_high": high}
