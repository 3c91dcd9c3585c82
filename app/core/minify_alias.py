"""Alias choice for key minification: which one-token string stands for each key.

Two styles (``MinifyOptions.alias_style``):

``letters``
    ``a``, ``b``, ... ``Z``, then two- and three-letter strings, in order: the cheapest
    aliases there are, but they tell the model nothing about the value it must write next.
``semantic``
    a word of the key itself (``extracted_customer_organization_department_name`` ->
    ``department``, ``invoiceTotalAmountUsd`` -> ``total``) when one qualifies, else the
    next letter. The key the model writes right before a value is its main hint of what
    that value is; with grammar-constrained decoding (vLLM, the reference engine) it never
    sees the schema, so a letter leaves it guessing.

A semantic candidate must be one token in the tier's tokenizer, cost no more than a letter
alias where keys are written (``{"w":``, ``,"w":``, ``, "w": ``), differ from every other
key and alias of its location, and match none of the location's ``patternProperties``.
Words are ranked: specific words before generic ones (``name``, ``value``, ``flag``, past
participles such as ``extracted``), words no sibling key contains before shared ones
(``customer`` in ``customer_name`` and ``customer_email`` tells them apart from nothing),
then right to left (the head noun of an English compound comes last, or just before
``of``). A word's usual short form (``organization`` -> ``org``) follows the word.
Everything depends on the keys, their order and the tokenizer only, so the choice is
deterministic per schema.
"""
from __future__ import annotations

import itertools
import re
import string
import threading
from functools import lru_cache
from typing import Iterator, Protocol

ALIAS_STYLES = ("semantic", "letters")


class TokenCounter(Protocol):
    name: str

    def count(self, text: str) -> int: ...


# Single letters are one token in cl100k_base, o200k_base and SmolLM2 (measured; see
# tests/minify/test_tokens.py); digits split off in all three, so "_c1"/"b1" cost 2-3.
DEFAULT_CANDIDATES: tuple[str, ...] = tuple(string.ascii_lowercase + string.ascii_uppercase)

# Words that say nothing on their own: never candidates.
FILLER = frozenset("""a an the of and or for to in on at by is are has have with per from
    as into via be up through""".split())
# Generic words: candidates only after every specific word of the key.
GENERIC = frozenset("""name names value values data info information field fields flag flags
    text string str txt number num nbr no code type kind level details detail record entry
    key obj object array list item items label id ids identifier raw full current main new
    old amount address usd eur gbp pct percent percentage indicator ind bool boolean yes
    """.split())
# Usual short forms, tried right after the word they shorten.
SHORT_FORMS: dict[str, tuple[str, ...]] = {
    "organization": ("org",), "organisation": ("org",), "department": ("dept",),
    "description": ("desc",), "identifier": ("id",), "number": ("num",),
    "quantity": ("qty",), "amount": ("amt",), "address": ("addr",),
    "telephone": ("phone",), "percentage": ("pct",), "percent": ("pct",),
    "reference": ("ref",), "information": ("info",), "configuration": ("config",),
    "document": ("doc",), "application": ("app",), "temperature": ("temp",),
    "maximum": ("max",), "minimum": ("min",), "average": ("avg",),
    "administrator": ("admin",), "authentication": ("auth",), "environment": ("env",),
    "specification": ("spec",), "message": ("msg",), "account": ("acct",),
    "transaction": ("txn",), "repository": ("repo",), "position": ("pos",),
    "latitude": ("lat",), "longitude": ("lon",), "statistics": ("stats",),
    "destination": ("dest",), "source": ("src",), "previous": ("prev",),
    "version": ("ver",), "category": ("cat",), "utilization": ("util",),
    "manufacturer": ("mfr",), "representative": ("rep",), "classification": ("class",),
    "telemetry": ("telem",), "timestamp": ("time",), "datetime": ("date",),
}
# Where a key is written in JSON output: after "{" or "," with compact separators, and with
# xgrammar's default ", " / ": ".
_CONTEXTS = ('{"%s":', ',"%s":', ', "%s": ')
# Without a tokenizer, a plain lowercase ASCII word this short stands in for "one token".
_MAX_WORD_WITHOUT_TOKENIZER = 8


@lru_cache(maxsize=8192)
def key_words(key: str) -> tuple[str, ...]:
    """The words of a key, lowercased, in order: split at anything not a letter (``_``,
    ``-``, spaces, digits, punctuation) and at camelCase / ``HTTPServer`` boundaries."""
    words: list[str] = []
    for run in re.split(r"[\W\d_]+", key):
        start = 0
        for i in range(1, len(run)):
            prev, cur = run[i - 1], run[i]
            nxt = run[i + 1] if i + 1 < len(run) else ""
            if (prev.islower() and cur.isupper()) or (
                    prev.isupper() and cur.isupper() and nxt.islower()):
                words.append(run[start:i])
                start = i
        if run:
            words.append(run[start:])
    return tuple(w.lower() for w in words if w)


def semantic_candidates(key: str, siblings: list[str]) -> list[str]:
    """Words of ``key`` (and their short forms) in the order they are tried; see the
    module docstring. ``siblings`` are all keys of the location (``key`` included)."""
    counts = _word_counts(siblings)
    return _ranked(key_words(key), counts)


def _word_counts(keys: list[str]) -> dict[str, int]:
    """word -> how many of ``keys`` contain it."""
    counts: dict[str, int] = {}
    for k in keys:
        for w in set(key_words(k)):
            counts[w] = counts.get(w, 0) + 1
    return counts


def _is_generic(word: str) -> bool:
    # Past participles are modifiers (extracted_, requested_, quantity_ordered).
    return word in GENERIC or (len(word) > 5 and word.endswith("ed"))


def _ranked(words: tuple[str, ...], counts: dict[str, int],
            head_last: bool = True) -> list[str]:
    if "of" in words[1:-1]:  # "modules_of_interest": the head noun is before "of"
        cut = words.index("of")
        words = words[cut + 1:] + words[:cut]
    words = [w for w in dict.fromkeys(words) if len(w) > 1 and w not in FILLER]
    n = len(words)
    order = sorted(range(n), key=lambda i: (_is_generic(words[i]),
                                            counts.get(words[i], 0) > 1,
                                            n - i if head_last else i))
    out: list[str] = []
    for i in order:
        for cand in (words[i], *SHORT_FORMS.get(words[i], ())):
            if cand not in out:
                out.append(cand)
    return out


class _WordCheck:
    """Per tokenizer: is a word one token, and no dearer than a letter where keys go?
    Cached, since the same words recur in every schema."""

    def __init__(self, counter: TokenCounter | None) -> None:
        self.counter = counter
        self.ok: dict[str, bool] = {}
        if counter is not None:
            self.letter_cost = [counter.count(c % "a") for c in _CONTEXTS]

    def __call__(self, word: str) -> bool:
        hit = self.ok.get(word)
        if hit is None:
            hit = self.ok[word] = self._check(word)
        return hit

    def _check(self, word: str) -> bool:
        if self.counter is None:
            return word.isascii() and word.isalpha() and len(word) <= _MAX_WORD_WITHOUT_TOKENIZER
        if self.counter.count(word) != 1:
            return False
        return all(self.counter.count(c % word) <= cost
                   for c, cost in zip(_CONTEXTS, self.letter_cost))


class _Candidates:
    """Lazily extended, deterministic list of one-token letter aliases for a tokenizer,
    and the tokenizer's cached word check."""

    def __init__(self, counter: TokenCounter | None) -> None:
        self.counter = counter
        self.items: list[str] = list(DEFAULT_CANDIDATES)
        if counter is not None:
            self.items = [c for c in self.items if counter.count(c) == 1]
        self._more = self._extra()
        self.word_ok = _WordCheck(counter)

    def _extra(self) -> Iterator[str]:
        low = string.ascii_lowercase
        for length in (2, 3):
            for tup in itertools.product(low, repeat=length):
                cand = "".join(tup)
                if self.counter is None or self.counter.count(cand) == 1:
                    yield cand

    def get(self, i: int) -> str | None:
        if i < len(self.items):
            return self.items[i]
        with _candidates_lock:
            while i >= len(self.items):
                nxt = next(self._more, None)
                if nxt is None:
                    return None
                self.items.append(nxt)
        return self.items[i]


_CANDIDATES: dict[str, _Candidates] = {}
_candidates_lock = threading.RLock()


def _candidates_for(counter: TokenCounter | None) -> _Candidates:
    name = counter.name if counter is not None else ""
    with _candidates_lock:
        if name not in _CANDIDATES:
            _CANDIDATES[name] = _Candidates(counter)
        return _CANDIDATES[name]


def _keep(key: str, counter: TokenCounter | None) -> bool:
    if counter is None:
        return len(key) <= 2
    return counter.count(key) <= 1


def assign_aliases(keys: list[str], patterns: list[re.Pattern], counter: TokenCounter | None,
                   style: str = "letters", for_values: bool = False) -> dict[str, str]:
    """original -> alias for the keys of one location (keys already one token stay).
    ``for_values``: the strings are the values of one enum. Their words are read left to
    right, since enum values lead with what tells them apart (``LOW_PRIORITY_ROUTINE_REQUEST``
    -> ``low``) where keys end with their head noun, and only a word no other value has
    qualifies: ``related`` for ``UNLIKELY_RELATED`` or ``grade`` for ``GRADE_1_MILD`` would
    tell the model the wrong thing, so such a value gets a letter."""
    cands = _candidates_for(counter)
    taken = set(keys)
    out: dict[str, str] = {}
    counts: dict[str, int] | None = None
    i = 0

    def free(cand: str) -> bool:
        return cand not in taken and not any(p.search(cand) for p in patterns)

    for k in keys:
        if _keep(k, counter):
            out[k] = k
            continue
        alias = None
        if style == "semantic":
            if counts is None:
                counts = _word_counts(keys)
            with _candidates_lock:  # the word cache is shared by threads
                alias = next((w for w in _ranked(key_words(k), counts, not for_values)
                              if free(w) and cands.word_ok(w)
                              and not (for_values and counts.get(w, 0) > 1)), None)
        while alias is None:
            cand = cands.get(i)
            if cand is None:
                break
            i += 1
            if free(cand):
                alias = cand
        out[k] = alias if alias is not None else k
        taken.add(out[k])
    return out
