"""Is a cached question the same question as a new one, reworded? The semantic cache's
verifier for gray-zone candidates (issue 22). Pure.

The entity signature (``app.core.entities``) has already matched: same ids, numbers
(spelled or not), names, dates, units, currencies, negations, bounds, directions and the
roles of entities. What is left are ordinary words, and a rewording changes exactly those:
"How many employees does X have in Y?" / "What is the number of employees X has in Y?" /
"What is the headcount of X in Y?". The check reads both questions into

- an *intent*: what kind of answer is asked for (a count, an amount, a time, a duration, a
  place, a person, a reason, a manner, a yes/no, an action), from the question word or from
  the noun that says it ("the number of", "the date of", "which city", "the reason");
- canonical content words: lemma, British/American spelling, a small synonym table
  (``SYNONYMS``: price = cost = fee, client = customer, ...), without the intent's own
  nouns and a few light words ("current", "make", "list");
- the function words the intent does not explain (modals, pronouns, quantifiers, "or"),
- the heads of directed entity-free phrases ("from staging to prod").

Two questions are the same when all of these agree, their shared content words come in the
same order (who does what to whom; steps of a code request), no content word of one is the
antonym of a word of the other (``ANTONYMS``, also reported as the reason), and the
embedding's cosine is at least the entry's threshold. Anything else is a different question:
the cache misses, which costs one upstream call, never a wrong answer.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from app.core.entities import (EntityProfile, canon_spelling, cased_names_agree,
                               cased_units_agree, content_order, content_words, normalise_text,
                               soft_items)
from app.core.entity_lexicon import COMMON_WORDS, LEXICON
from app.core.entity_parse import ASSOCIATIVE, FRAMES, lemma_candidates

# Groups of words that mean the same in a question; the first word is the canonical one.
# Never two words of an antonym pair in one group (a test checks).
SYNONYMS: list[tuple[str, ...]] = [
    ("employee", "staff", "worker", "personnel", "employe"),
    ("customer", "client"),
    ("price", "cost", "fee", "charge", "pricing"),
    ("ship", "shipping", "shipment", "dispatch"),
    ("deliver", "delivery"),
    ("summarize", "summary", "recap"),
    ("expire", "expiry", "expiration"),
    ("revenue", "turnover"),
    ("refund", "reimbursement"),
    ("warranty", "guarantee"),
    ("contract", "agreement"),
    ("invoice", "bill"),
    ("unpaid", "outstanding"),
    ("spend", "spending", "expenditure"),
    ("use", "utilize", "utilise"),
    ("headquarters", "hq", "headquarter", "headquartered"),
    ("order", "ordered"),
    ("place", "placed"),
    ("open", "opened"),
    ("begin", "start", "commence"),
    ("end", "finish"),
    ("big", "large"),
    ("error", "fault"),
    ("ticket", "case"),
    ("help", "assist", "assistance"),
    ("setting", "configuration", "config"),
    ("password", "passcode"),
    ("account", "acct"),
]
# Opposites that share everything else in a question; a pair across the two sides refuses.
ANTONYMS: list[tuple[str, str]] = [
    ("include", "exclude"), ("before", "after"), ("profit", "loss"), ("rise", "fall"),
    ("gain", "lose"), ("open", "close"), ("opened", "closed"), ("highest", "lowest"),
    ("earliest", "latest"), ("maximum", "minimum"), ("max", "min"), ("inbound", "outbound"),
    ("import", "export"), ("arrival", "departure"), ("early", "late"),
    ("approved", "rejected"), ("approve", "reject"), ("cheapest", "expensive"),
    ("win", "lose"), ("increase", "decrease"), ("enable", "disable"), ("accept", "reject"),
    ("asset", "liability"), ("credit", "debit"), ("income", "expense"), ("hot", "cold"),
    ("first", "last"), ("inside", "outside"), ("upper", "lower"), ("buy", "sell"),
    ("push", "pull"), ("upload", "download"), ("input", "output"), ("paid", "unpaid"),
    ("active", "inactive"), ("internal", "external"), ("public", "private"),
    ("success", "failure"), ("online", "offline"), ("start", "end"), ("add", "remove"),
    ("allow", "deny"), ("entry", "exit"), ("senior", "junior"), ("minor", "major"),
    ("strong", "weak"), ("long", "short"), ("fast", "slow"), ("heavy", "light"),
    ("cheap", "expensive"), ("new", "old"), ("hire", "fire"), ("lend", "borrow"),
    ("debtor", "creditor"), ("buyer", "seller"), ("sender", "recipient"), ("parent", "child"),
    ("source", "target"), ("encrypt", "decrypt"), ("compress", "decompress"), ("win", "loss"),
    ("gross", "net"), ("min", "maximum"), ("north", "south"), ("east", "west"),
]
# Nouns that only say what kind of answer is wanted: the intent, not the topic.
INTENT_NOUNS = {"number": "count", "count": "count", "quantity": "count", "total": "count",
                "amount": "amount", "sum": "amount", "size": "amount", "value": "amount",
                "date": "when", "day": "when", "time": "when|duration", "deadline": "when",
                "period": "duration", "duration": "duration", "length": "duration",
                "term": "duration", "city": "where", "location": "where", "place": "where",
                "country": "where", "address": "where", "person": "who", "reason": "why",
                "cause": "why", "way": "how", "method": "how", "procedure": "how",
                "steps": "how", "step": "how", "frequency": "often"}
# "the headcount" is "the number of employees".
EXPANSIONS = {"headcount": ("number", "employee"), "staffing": ("number", "employee")}
# Words a rewording adds or drops without changing the question.
LIGHT = frozenset("""current currently overall actual present list display provide fetch make
earn generate take get have do kindly exactly""".split()) - {"exactly"}
_HOW = {"many": "count", "much": "amount", "long": "duration", "big": "amount",
        "large": "amount", "often": "often", "old": "age", "far": "distance"}
_WH = {"when": "when", "where": "where", "who": "who", "whom": "who", "whose": "who",
       "why": "why"}
_AUX = frozenset("""is are was were am do does did can could will would should shall may
might must has have had""".split())
DIRECTED = frozenset("""to from into onto toward towards than versus vs against by between
per via through before after until till since within without except over under above below
beyond past""".split())
_INFLECTIONS = ("s", "ed", "ing")
_WORD_RE = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)?")

_CANON = {w: g[0] for g in SYNONYMS for w in g}
_ANTONYM_OF: dict[str, set[str]] = {}
for _a, _b in ANTONYMS:
    _ANTONYM_OF.setdefault(_a, set()).add(_b)
    _ANTONYM_OF.setdefault(_b, set()).add(_a)


@lru_cache(maxsize=65536)
def lemma(word: str) -> str:
    """The shortest common form of ``word`` ("shipping" -> "ship", "uses" -> "use"), spelling
    and synonyms folded."""
    word = canon_spelling(word)
    if word in _CANON:
        return _CANON[word]
    best = word
    if word in COMMON_WORDS and not word.endswith(_INFLECTIONS):
        return word  # "number" is not "numb"
    for cand in lemma_candidates(word):
        if len(cand) >= 3 and cand in COMMON_WORDS and len(cand) < len(best):
            best = cand
    return _CANON.get(best, best)


@dataclass(frozen=True)
class QuestionForm:
    """What the verifier compares of one question."""
    intent: frozenset[str]
    content: frozenset[str]
    raw_words: frozenset[str]
    order: tuple[str, ...]
    function: tuple[str, ...]
    heads: tuple[str, ...]
    attached: frozenset[str]   # what stands after "of"/"for"/"on"... (entity or head word)


def _intent(words: list[str], content: list[str]) -> tuple[frozenset[str], set[str]]:
    """(the possible intents, the words the intent consumed)."""
    for i, w in enumerate(words):
        if w == "how":
            nxt = words[i + 1] if i + 1 < len(words) else ""
            if nxt in _HOW:
                return frozenset({_HOW[nxt]}), {nxt}
            return frozenset({"how"}), set()
        if w in _WH:
            return frozenset({_WH[w]}), set()
        if w in ("what", "which"):
            first = next((c for c in content[i + 1:] if c in INTENT_NOUNS), None)
            if first is None:
                return frozenset({"what"}), set()
            kinds = set(INTENT_NOUNS[first].split("|"))
            # "the total number of": every intent noun of the same kind is the intent's
            used = {c for c in content[i + 1:] if c in INTENT_NOUNS
                    and kinds & set(INTENT_NOUNS[c].split("|"))}
            return frozenset(kinds), used
    if words and words[0] in _AUX:
        return frozenset({"yn"}), set()
    return frozenset({"do"}), set()


@lru_cache(maxsize=8192)
def question_form(text: str) -> QuestionForm:
    norm = FRAMES.sub(" ", normalise_text(text))
    words = _WORD_RE.findall(norm)
    content: list[str] = []
    for w in words:
        for part in EXPANSIONS.get(w, (w,)):
            content.append(part)
    lemmas = [lemma(w) if w not in INTENT_NOUNS else w for w in content]
    intent, used = _intent(words, lemmas)
    intent = frozenset("what" if k == "amount" else k for k in intent)
    soft = soft_items(text)
    function = tuple(sorted(i for i in soft if ">" not in i and not i.startswith("wh:")
                            and not (i == "q:many" and "count" in intent)))
    heads = tuple(sorted(lemma_head(r) for r in soft if ">^" in r
                         and r.split(">", 1)[0] in DIRECTED))
    attached = frozenset(_attached(r) for r in soft if ">" in r and not r.startswith("seq:")
                         and r.split(">", 1)[0] in ASSOCIATIVE)
    words_set = {lemma(w) for part in content_words(text) for w in EXPANSIONS.get(part, (part,))}
    # a word the signature reads ("opened" is dir:open) is already compared there
    kept = frozenset(w for w in words_set if w not in used and w not in LIGHT
                     and w not in LEXICON)
    order = tuple(lemma(w) for g in content_order(text) for w in g.split("+")
                  if lemma(w) in kept)
    return QuestionForm(intent, kept, frozenset(words_set), order, function, heads, attached)


def _attached(role: str) -> str:
    thing = role.split(">", 1)[1]
    return "^" + lemma(thing[1:]) if thing.startswith("^") else thing


def lemma_head(role: str) -> str:
    prep, head = role.split(">^", 1)
    return f"{prep}>{lemma(head)}"


def _order_agrees(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    shared = set(a) & set(b)
    return [w for w in dict.fromkeys(a) if w in shared] == [w for w in dict.fromkeys(b) if w in shared]


def antonym_between(a: frozenset[str], b: frozenset[str]) -> tuple[str, str] | None:
    for w in a - b:
        for o in _ANTONYM_OF.get(w, ()):
            if o in b and o not in a:
                return w, o
    return None


def same_question(text_a: str, prof_a: EntityProfile, text_b: str,
                  prof_b: EntityProfile) -> tuple[bool, str]:
    """(whether one answer serves both, why not). The cosine is the caller's."""
    if prof_a.signature_hash != prof_b.signature_hash:
        return False, "entities"
    if not (cased_names_agree(prof_a.cased, prof_b.cased)
            and cased_units_agree(prof_a.units, prof_b.units)):
        return False, "casing"
    fa, fb = question_form(text_a), question_form(text_b)
    pair = antonym_between(fa.raw_words, fb.raw_words)
    if pair is not None:
        return False, f"antonym {pair[0]}/{pair[1]}"
    if not (fa.intent & fb.intent):
        return False, "intent"
    if fa.function != fb.function:
        return False, "function words"
    if fa.heads != fb.heads:
        return False, "roles"
    # "the revenue of Acme" / "how much revenue did Acme make": something may move into or
    # out of an of/for/on phrase, but not one thing in and another out ("approve expenses
    # for Keller" / "Keller approve expenses for Haddad")
    if fa.attached - fb.attached and fb.attached - fa.attached:
        return False, "roles"
    if fa.content != fb.content:
        return False, "content"
    if not _order_agrees(fa.order, fb.order):
        return False, "order"
    return True, ""


__all__ = ["ANTONYMS", "SYNONYMS", "ASSOCIATIVE", "QuestionForm", "question_form",
           "same_question", "antonym_between", "lemma"]
