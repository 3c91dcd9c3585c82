"""Entity signature: the meaning-bearing tokens two prompts must share before a semantic
cache may treat them as the same question (FL-28A).

Everything is case-folded first, so the signature never depends on casing. Named things are
found without capitalisation: a token is a named thing when it is not a common English word
(``data/common_words.txt``, built from a BPE vocabulary, see ``build_common_words.py``) or
when it is in the lexicon of places, months, vendors and regimes below. Capitalised common
words ("Umbrella", "Stark Industries") can only be told apart by casing, so that is a
separate, optional check: ``cased_names`` / ``cased_names_agree``.

The signature is a sorted multiset (a tuple with repeats), so "1 1 2" and "2 1 2" differ,
plus role items so that order matters where it carries meaning: "100 USD to EUR" is not
"100 EUR to USD", "Alice paid Bob" is not "Bob paid Alice", while moving a phrase ("In
Nevada, what is the tax rate?") changes nothing. How text is read: ``entity_parse``; the
word lists: ``entity_lexicon``. Data-size units differ only by case ("Mb" bit, "MB" byte):
``cased_units`` / ``cased_units_agree``, optional like the names.
"""
from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

from app.core import entity_lexicon as _lex
from app.core.entity_parse import (ASSOCIATIVE, DIGIT_RE, FRAMES, TOKEN_RE, analyse, is_common,
                                   strip_contraction)

COMMON_WORDS = _lex.COMMON_WORDS
LEXICON = _lex.LEXICON
_FILLERS = _lex.FILLERS
_TOKEN_RE = TOKEN_RE
_DIGIT_RE = DIGIT_RE
_is_common = is_common
_strip_contraction = strip_contraction


def normalise_text(text: str) -> str:
    """NFKC, typographic quotes to ASCII, case-folded, single spaces."""
    text = unicodedata.normalize("NFKC", text or "").replace("\u2019", "'").replace("\u2018", "'")
    return " ".join(text.casefold().split())


@lru_cache(maxsize=512)
def _analysed(text: str) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], int]:
    items, roles, order, loose = analyse(normalise_text(text))
    return tuple(sorted(items)), tuple(sorted(roles)), tuple(dict.fromkeys(order)), loose


# Items of ordinary words that shape a question without naming anything: question words,
# quantifiers, modals, pronouns, "or". They are compared (``profiles_compatible``, and the
# verifier in ``app.core.cache_verify`` reads them through a rewording), but they are not in
# the signature hash, so "How many employees ..." and "What is the number of employees ..."
# reach the same bucket. Entities (ids, numbers, names, dates, units, currencies, negations,
# bounds, directions) and the roles of entities are in the hash.
SOFT_CATEGORIES = ("wh", "q", "mod", "pr", "conj")


def _is_soft_item(item: str) -> bool:
    return item.split(":", 1)[0] in SOFT_CATEGORIES


def _is_soft_role(role: str, loose: int) -> bool:
    """A phrase with no entity in it ("from>^staging": its head is an ordinary word), or the
    one entity that stands bare or after "of"/"for"/"on"... ("the revenue of Acme" / "how
    much did Acme make"): nothing else could take its role."""
    if ">^" in role:
        return True
    return loose <= 1 and role.split(">", 1)[0] in ASSOCIATIVE


@lru_cache(maxsize=512)
def _split(text: str) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(hard items, hard roles, soft items and roles) of ``text``."""
    items, roles, _, loose = _analysed(text)
    hard = tuple(i for i in items if not _is_soft_item(i))
    hard_roles = tuple(r for r in roles if not _is_soft_role(r, loose))
    soft = tuple(sorted([i for i in items if _is_soft_item(i)]
                        + [r for r in roles if _is_soft_role(r, loose)]))
    return hard, hard_roles, soft


def entity_signature(text: str) -> tuple[str, ...]:
    """Sorted multiset of normalised entity items, e.g. ``('cur:usd', 'n:40277', 'name:soylent')``."""
    return _analysed(text)[0]


def entity_roles(text: str) -> tuple[str, ...]:
    """Sorted role items: entities tagged with their preposition (``'to>cur:eur'``) and the
    order of the entities outside any phrase (``'seq:name:alice>name:bob'``)."""
    return _analysed(text)[1]


def entity_signature_hash(text: str) -> str:
    """Hash of the entities and their roles: what must match exactly before any vector math.
    Ordinary words' items (``SOFT_CATEGORIES``) are left out: see ``soft_items``."""
    items, roles, _ = _split(text)
    return hashlib.sha256("\x1f".join((*items, "\x1e", *roles)).encode()).hexdigest()[:32]


def soft_items(text: str) -> tuple[str, ...]:
    """The question words, quantifiers, modals, pronouns and entity-free phrase heads of
    ``text``: compared, not hashed."""
    return _split(text)[2]


_NOT_CONTENT = frozenset(LEXICON) | frozenset(_lex.UNIT_CANON) | frozenset(_lex.NUMBER_WORDS) \
    | frozenset(_lex.MAGNITUDES) | frozenset(_lex.ORDINAL_WORDS) | frozenset(_lex.MONTHS)


_CASE_TOKEN = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)*")
_OPENERS = set(".!?:;\"'(*-\u2022>#")


def _at_sentence_start(text: str, start: int) -> bool:
    j = start - 1
    newline = False
    while j >= 0 and text[j].isspace():
        newline = newline or text[j] == "\n"
        j -= 1
    return j < 0 or newline or text[j] in _OPENERS


_COMPOUND = re.compile(r"[^\W_]+(?:['.\-_/][^\W_]+)*")


def cased_names(text: str) -> frozenset[str] | None:
    """Common words written capitalised away from a sentence start ("for Umbrella"), folded.

    None when casing says nothing: no mid-sentence capitals at all, or mostly capitals
    (shouting, Title Case), so an all-lower or all-upper paraphrase is never rejected.
    IDs with digits (Tier-3, EU-West-1) are left to the signature.
    """
    text = unicodedata.normalize("NFKC", text or "").replace("\u2019", "'")
    found: set[str] = set()
    mid = capital_mid = 0
    for m in _COMPOUND.finditer(text):
        tok = m.group()
        if _DIGIT_RE.search(tok) or _at_sentence_start(text, m.start()):
            continue
        mid += 1
        if not tok[0].isupper():
            continue
        capital_mid += 1
        for part in re.split(r"[-_./]", _strip_contraction(tok.casefold())):
            if part and part != "i" and _is_common(part) and part not in _FILLERS \
                    and part not in _NOT_CONTENT:  # months, units...: the signature has them
                found.add(part)
    if capital_mid == 0 or capital_mid * 2 > mid:
        return None
    return frozenset(found)


def cased_names_agree(a: frozenset[str] | None, b: frozenset[str] | None) -> bool:
    return a is None or b is None or a == b


_STOPWORDS = frozenset(_FILLERS) | frozenset("""a an the this that these those is are was were be
been being am do does did doing have has had having can could will would shall should may might
must of to for from in on at by with about as into onto upon via per and or but if then so than
too very just what which who whom whose when where why how it its they them their there here
he him his she her hers me mine you your yours i we our ours us my myself yourself one ones
such other another same own also again further once let lets get got give show find tell know
need want like help question answer info information details detail say said ask asked
is's""".split())


def canon_spelling(word: str) -> str:
    """British -ise/-isation read as -ize/-ization ("summarise" = "summarize")."""
    if "is" not in word:
        return word
    return word.replace("isation", "ization").replace("ise", "ize")


def content_words(text: str) -> frozenset[str]:
    """Common content words (folded, plural -s dropped): what a word swap would change.
    Greetings and request frames ("Hi team,", "could you") are not read."""
    out: set[str] = set()
    for m in _TOKEN_RE.finditer(FRAMES.sub(" ", normalise_text(text))):
        if m.lastgroup != "word":
            continue
        tok = _strip_contraction(m.group())
        if _DIGIT_RE.search(tok) or tok.endswith("n't"):
            continue
        for part in re.split(r"[-_./:@+]", tok):
            if len(part) < 2 or part in _STOPWORDS or part in _NOT_CONTENT or not _is_common(part):
                continue
            if len(part) > 3 and part.endswith("s") and not part.endswith("ss"):
                part = part[:-1]
            out.add(canon_spelling(part))
    return frozenset(out)


def content_compatible(a: frozenset[str], b: frozenset[str]) -> bool:
    """False when each side has a content word the other lacks (a swap, not an addition)."""
    return not (a - b) or not (b - a)


def content_order(text: str) -> tuple[str, ...]:
    """Plain content words outside prepositional phrases, in order, each once: who does
    what to whom when no named thing says it ("does the dog chase the cat")."""
    return _analysed(text)[2]


def _positions(order: tuple[str, ...]) -> dict[str, int]:
    """Word -> the position of its group ("afterward+list" is two words at one place)."""
    pos: dict[str, int] = {}
    for i, group in enumerate(order):
        for w in group.split("+"):
            pos.setdefault(canon_spelling(w), i)
    return pos


def content_order_agrees(a: tuple[str, ...] | None, b: tuple[str, ...] | None) -> bool:
    """The words both sides have come in the same order (added words are fine; words of one
    coordinated group are unordered among themselves). Words inside a group count one by one:
    "sorts the list and afterwards removes duplicates" is not "removes duplicates and
    afterwards sorts the list"."""
    if a is None or b is None:
        return True
    pa, pb = _positions(a), _positions(b)
    shared = [w for w in pa if w in pb]
    for i, x in enumerate(shared):
        for y in shared[i + 1:]:
            da, db = pa[x] - pa[y], pb[x] - pb[y]
            if da and db and (da > 0) != (db > 0):
                return False
    return True


_DATA_UNIT = re.compile(r"(?<![^\W\d_])([kmgtpe]i?)(b)(ps|/s|it|its|yte|ytes)?(?![^\W\d_])",
                        re.I)


def cased_units(text: str) -> tuple[tuple[str, str], ...] | None:
    """Data-size units in order, each (folded unit, "bit" | "byte" | "?"): "Mb"/"Mbps" are
    bits, "MB"/"MBps" bytes, "mb" says nothing. None when the rest of the text is shouted
    (mostly capitals), where the casing of a unit says nothing either."""
    text = unicodedata.normalize("NFKC", text or "")
    found, spans = [], []
    for m in _DATA_UNIT.finditer(text):
        prefix, b, tail = m.group(1), m.group(2), m.group(3) or ""
        if tail[:1].lower() == "i" or tail[:1].lower() == "y":  # "Mbit", "Mbyte": spelt out
            continue
        kind = "byte" if b == "B" else "bit" if any(c.isupper() for c in prefix) else "?"
        found.append(((prefix + b + tail).casefold(), kind))
        spans.append(m.span())
    if not found:
        return ()
    rest = "".join(c for i, c in enumerate(text) if not any(a <= i < z for a, z in spans))
    upper = sum(c.isupper() for c in rest)
    if upper >= 4 and upper * 2 > sum(c.isalpha() for c in rest):
        return None
    return tuple(found)


def cased_units_agree(a: tuple | None, b: tuple | None) -> bool:
    if a is None or b is None:
        return True
    if len(a) != len(b):
        return False
    return all(ua == ub and (ka == kb or "?" in (ka, kb)) for (ua, ka), (ub, kb) in zip(a, b))


@dataclass(frozen=True)
class EntityProfile:
    """What the semantic cache keeps about a prompt besides its embedding."""
    signature_hash: str
    cased: frozenset[str] | None
    content: frozenset[str]
    units: tuple[tuple[str, str], ...] | None = None
    order: tuple[str, ...] | None = None
    soft: tuple[str, ...] | None = None    # ``soft_items``; None: not known (an old record)

    def to_dict(self) -> dict:
        return {"sig": self.signature_hash,
                "cased": None if self.cased is None else sorted(self.cased),
                "content": sorted(self.content),
                "units": None if self.units is None else [list(u) for u in self.units],
                "order": None if self.order is None else list(self.order),
                "soft": None if self.soft is None else list(self.soft)}

    @classmethod
    def from_dict(cls, d: dict) -> "EntityProfile":
        cased, units, order, soft = d.get("cased"), d.get("units"), d.get("order"), d.get("soft")
        return cls(d["sig"], None if cased is None else frozenset(cased),
                   frozenset(d.get("content") or ()),
                   None if units is None else tuple(tuple(u) for u in units),
                   None if order is None else tuple(order),
                   None if soft is None else tuple(soft))


def entity_profile(text: str) -> EntityProfile:
    return EntityProfile(entity_signature_hash(text), cased_names(text), content_words(text),
                         cased_units(text), content_order(text), soft_items(text))


def profiles_compatible(a: EntityProfile, b: EntityProfile) -> bool:
    """The whole guard, word for word: same signature (entities and roles), the same question
    words, quantifiers, modals and pronouns, casing of names and data units does not
    contradict, no content-word swap, shared content words in the same order. A rewording
    that fails only the word-for-word parts is the verifier's to judge
    (``app.core.cache_verify``)."""
    return (a.signature_hash == b.signature_hash and a.soft is not None and a.soft == b.soft
            and cased_names_agree(a.cased, b.cased)
            and cased_units_agree(a.units, b.units)
            and content_compatible(a.content, b.content)
            and content_order_agrees(a.order, b.order))
