"""Reading a prompt into entity items and role items (the entity signature's two halves).

Pure. Text is case-folded first (``normalise_text``), so nothing here depends on casing.

1. Tokens become atoms: numbers, number words, ordinals, months, symbols, words. Each word
   atom has items (``name:reno``, ``neg:not``, ``mod:can``...) and a class for phrase
   reading: preposition, determiner, boundary, coordinator, entity or content.
2. Numbers are combined: "twenty-one" = 21, "5 thousand" = "5k" = "5,000" = 5000, "$5M" is
   five million dollars (not five metres), "$5000.00" = "$5,000"; dates are one item however
   written ("March 3rd" = "3 March" = "the 3rd of March"; "2026-03-03" = "March 3, 2026").
3. Roles: an entity inside a prepositional phrase is tagged with the preposition
   ("to>cur:eur"); entities outside any phrase keep their order ("seq:alice>bob"), with
   coordinated ones ("Alice and Bob") unordered. Moving a phrase ("In Nevada, what is ..." /
   "What is ... in Nevada?") keeps the roles; swapping who-does-what-to-whom does not.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from functools import lru_cache

from app.core.entity_lexicon import (BIGRAMS, BOUND_ONLY, BOUNDARIES, COMMON_WORDS, COORDINATORS,
                                     CURRENCY_ITEMS, DETERMINERS, FILLERS, LABEL_NOUNS, LEXICON,
                                     MAGNITUDES, MONEY_MAGNITUDES, MONTHS, NO_APOSTROPHE, NT_FORMS,
                                     NUMBER_WORDS, ORDINAL_SUFFIXES, ORDINAL_WORDS, PREPOSITIONS,
                                     UNIT_CANON)

TOKEN_RE = re.compile(r"""
    (?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?)                       # 40,277  1,000.50
  | (?P<word>[^\W_]+(?:'[^\W_]+)*(?:[-_./:@+][^\W_]+(?:'[^\W_]+)*)*)  # words, ids, v2.3, dates
  | (?P<sym>[$€£¥₹₩₽¢₿₺₪%°])
  | (?P<punct>[,;:!?()\[\]{}"]|\.(?!\w)|\s[-–—]\s)
""", re.X)
DIGIT_RE = re.compile(r"\d")
_NUM_SUFFIX_RE = re.compile(r"^(\d+(?:\.\d+)?)([a-z%]+)$")
_PLAIN_NUM_RE = re.compile(r"^\d+(?:\.\d+)?$")
_ISO_DATE_RE = re.compile(r"^(\d{4})[-/](\d{1,2})[-/](\d{1,2})$")
_ID_SEP_RE = re.compile(r"(?<=[^\W\d_])[-_](?=\d)|(?<=\d)[-_](?=[^\W\d_])")
_CONTRACTIONS = ("'s", "'ll", "'re", "'ve", "'d", "'m", "'")
_SUFFIXES = ("ing", "ed", "es", "s", "d", "ly", "er")
# Request frames and pleasantries carry no meaning but would add pronoun, modal, time or
# role items ("good morning", "thanks in advance", "can you ...").
_CLAUSE_START = r"(?:^|(?<=[,.!?:;]\ )|(?<=please\ )|(?<=^hi\ )|(?<=^hey\ )|(?<=^hello\ ))"
_GREETING = r"""(?:hi|hello|hey|hiya|dear|greetings|morning|good\ (?:morning|afternoon|evening|day))
    (?:\ (?:team|all|everyone|everybody|folks|there|colleagues|guys|friends|y'all))?\ ?[,!:.]"""
_FRAMES = re.compile(rf"""
    ^{_GREETING}
  |    \b(?:can|could|would|will)\ you\ (?:please\ |kindly\ )?(?:tell|show|give|let)\ me\b
  | {_CLAUSE_START}(?:can|could|would|will)\ you\ (?:please\ |kindly\ )?(?=\w)
  | \b(?:i(?:\ would|'d)\ like\ to\ know|i\ want\ to\ know|i\ was\ wondering|i\ wonder
      |just\ wondering|do\ you\ know|let\ me\ know|tell\ me|thank\ you|thanks|thx
      |in\ advance|by\ the\ way|btw|as\ soon\ as\ possible|asap|if\ possible
      |good\ (?:morning|afternoon|evening|day)|hi\ there|hello\ there|hey\ there)\b
""", re.X)
_ENTITY_CATS = ("name", "n", "cur", "unit", "date", "month", "day", "when", "ord", "sym")
_STOPWORDS = frozenset(FILLERS) | BOUNDARIES | DETERMINERS


@lru_cache(maxsize=65536)
def lemma_candidates(word: str) -> tuple[str, ...]:
    out = [word]
    for suf in _SUFFIXES:
        if word.endswith(suf) and len(word) - len(suf) >= 3:
            base = word[: -len(suf)]
            out += [base, base + "e"]
            if len(base) >= 4 and base[-1] == base[-2]:  # stopped -> stop
                out.append(base[:-1])
            if base.endswith("i"):  # studies -> study
                out.append(base[:-1] + "y")
    if "is" in word:  # British spelling: summarise, organisation, normalised
        out += [w.replace("isation", "ization").replace("ise", "ize") for w in out if "is" in w]
    return tuple(out)


def is_common(word: str) -> bool:
    return any(c in COMMON_WORDS for c in lemma_candidates(word))


def strip_contraction(word: str) -> str:
    if word.endswith("n't") or "'" not in word:
        return word
    for suf in _CONTRACTIONS:
        if word.endswith(suf):
            return word[: -len(suf)]
    return word


@dataclass
class Atom:
    kind: str                      # punct num id date numword mag ord month sym word
    text: str = ""
    items: list[str] = field(default_factory=list)
    value: Decimal | None = None   # numbers, ordinals, months
    suffix: str = ""               # letters glued to a number: "k", "m", "st", "kg"
    cls: str = "content"           # prep det boundary coord entity content


def _fmt(value: Decimal) -> str:
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def _money_digits(raw: str) -> str:
    """"5000.00" -> "5000", "12.50" -> "12.5" (money only: "3.10" may be a version)."""
    return raw.rstrip("0").rstrip(".") if "." in raw else raw


def _number_atom(tok: str) -> Atom:
    tok = tok.replace(",", "")
    m = _ISO_DATE_RE.match(tok)
    if m and 1 <= int(m.group(2)) <= 12 and 1 <= int(m.group(3)) <= 31:
        return Atom("date", tok, [f"date:{int(m.group(1))}-{int(m.group(2))}-{int(m.group(3))}"])
    tok = _ID_SEP_RE.sub("", tok)
    if _PLAIN_NUM_RE.match(tok):
        return Atom("num", tok, value=Decimal(tok))
    m = _NUM_SUFFIX_RE.match(tok)
    if m and (m.group(2) in UNIT_CANON or m.group(2) in MAGNITUDES
              or m.group(2) in MONEY_MAGNITUDES or m.group(2) in ORDINAL_SUFFIXES):
        return Atom("num", m.group(1), value=Decimal(m.group(1)), suffix=m.group(2))
    return Atom("id", tok, [f"n:{tok}"], cls="entity")


def _numberish(atom: Atom | None) -> bool:
    return atom is not None and atom.kind in ("num", "numword", "mag")


def _word_atoms(part: str, prev: Atom | None, whole: bool) -> list[Atom]:
    """Atoms of one alphabetic part; ``whole`` when it is not a piece of a hyphenated word."""
    if part.endswith("n't") or part in NO_APOSTROPHE:
        modal = NT_FORMS.get(part[:-3], "") if part.endswith("n't") else NO_APOSTROPHE[part]
        return [Atom("word", part, ([f"mod:{modal}"] if modal else []) + ["neg:not"],
                     cls="boundary")]
    if part in NUMBER_WORDS:
        return [Atom("numword", part, value=Decimal(NUMBER_WORDS[part]))]
    if part in MAGNITUDES and (part not in ("k", "grand") or _numberish(prev)):
        return [Atom("mag", part, value=Decimal(MAGNITUDES[part]))]
    if part in UNIT_CANON and (_numberish(prev) or (prev is not None and prev.text == "°")
                               or part not in BOUND_ONLY):
        return [Atom("word", part, [f"unit:{UNIT_CANON[part]}"], cls="entity")]
    if part in ORDINAL_WORDS:
        return [Atom("ord", part, value=Decimal(ORDINAL_WORDS[part]))]
    if part in MONTHS:
        return [Atom("month", part, [f"month:{MONTHS[part]}"], value=Decimal(MONTHS[part]),
                     cls="entity")]
    hit = LEXICON.get(part)
    if hit is None and len(part) > 3:
        hit = next((LEXICON[c] for c in lemma_candidates(part) if c in LEXICON), None)
    if hit is not None:
        items = [hit]
    elif len(part) == 1 and whole and part not in "ai":
        items = [f"name:{part}"]  # "plan B", "vitamin D"
    elif is_common(part):
        items = []
    else:
        items = [f"name:{part}"]
    return [Atom("word", part, items, cls=_word_class(part, items))]


def _word_class(word: str, items: list[str]) -> str:
    if word in PREPOSITIONS:
        return "prep"
    if word in COORDINATORS:
        return "coord"
    if word in DETERMINERS:
        return "det"
    if word in _STOPWORDS:
        return "boundary"
    if any(i.split(":", 1)[0] in _ENTITY_CATS for i in items):
        return "entity"
    return "content"


FRAMES = _FRAMES


def _atoms(norm: str) -> list[Atom]:
    atoms: list[Atom] = []
    for m in TOKEN_RE.finditer(_FRAMES.sub(" ", norm)):
        kind, tok = m.lastgroup, m.group()
        prev = atoms[-1] if atoms else None
        if kind == "punct":
            atoms.append(Atom("punct", tok.strip(), cls="boundary"))
        elif kind == "sym":
            atoms.append(Atom("sym", tok, [LEXICON.get(tok) or _unit_item(tok) or f"sym:{tok}"],
                              cls="entity"))
        elif kind == "num":
            atoms.append(_number_atom(tok))
        else:
            tok = strip_contraction(tok)
            if not tok:
                continue
            if DIGIT_RE.search(tok):
                atoms.append(_number_atom(tok))
            elif "@" in tok or "." in tok or "/" in tok or ":" in tok:
                atoms.append(Atom("word", tok, [f"name:{tok}"], cls="entity"))  # domains, paths
            else:
                parts = [p for p in re.split(r"[-_+]", tok) if p]
                for part in parts:
                    new = _word_atoms(part, prev, whole=len(parts) == 1)
                    if prev is not None and (prev.text, part) in BIGRAMS:
                        new[-1].items.append(f"name:{prev.text} {part}")
                        new[-1].cls = "entity"
                    atoms.extend(new)
                    prev = atoms[-1]
    _labels(atoms)
    return atoms


def _unit_item(sym: str) -> str | None:
    return f"unit:{UNIT_CANON[sym]}" if sym in UNIT_CANON else None


def _labels(atoms: list[Atom]) -> None:
    """"plan A more expensive": an "a" after a label noun and before no noun is a name."""
    for i, atom in enumerate(atoms):
        if atom.text != "a" or i == 0 or atoms[i - 1].text not in LABEL_NOUNS:
            continue
        nxt = atoms[i + 1] if i + 1 < len(atoms) else None
        if nxt is None or nxt.cls in ("boundary", "prep", "coord") or any(
                it.startswith(("cmp:", "neg:")) for it in nxt.items):
            atom.items, atom.cls = ["name:a"], "entity"


def _is_currency(atom: Atom | None) -> bool:
    return atom is not None and any(i in CURRENCY_ITEMS for i in atom.items)


def _read_words(atoms: list[Atom], i: int) -> tuple[int, Decimal]:
    """A run of number words from ``i``: "twenty one" = 21, "five thousand two hundred"."""
    total, current, last = Decimal(0), None, None
    j = i
    while j < len(atoms):
        a = atoms[j]
        if a.kind == "numword":
            v = a.value
            if not (last is None or last.kind == "mag"
                    or (last.value % 10 == 0 and last.value >= 20 and v < 10)):
                break
            current = (current or 0) + v
        elif a.kind == "mag" and (last is not None or a.text != "k"):
            if a.value == 100:
                current = (current or 1) * 100
            else:
                total += (current or 1) * a.value
                current = None
        elif (a.text == "and" and last is not None and last.kind == "mag" and j + 1 < len(atoms)
              and atoms[j + 1].kind == "numword"):
            j += 1
            continue
        else:
            break
        last = a
        j += 1
    return j, total + (current or 0)


def _numbers(atoms: list[Atom]) -> list[Atom]:
    """Number runs become one ``num`` atom with items; ordinals get their value."""
    out: list[Atom] = []
    i = 0
    while i < len(atoms):
        a = atoms[i]
        if a.kind in ("numword", "mag"):
            j, value = _read_words(atoms, i)
            if j == i:  # a stray "k": a letter
                out.append(Atom("word", a.text, [f"name:{a.text}"], cls="entity"))
                i += 1
                continue
            out.append(Atom("num", _fmt(value), value=value, cls="entity"))
            out[-1].items = [f"n:{out[-1].text}"]
            i = j
            continue
        if a.kind != "num":
            out.append(a)
            i += 1
            continue
        value, raw, units, scaled = a.value, a.text, [], False
        nxt = atoms[i + 1] if i + 1 < len(atoms) else None
        money = _is_currency(out[-1] if out else None) or _is_currency(nxt)
        if a.suffix in ORDINAL_SUFFIXES:
            out.append(Atom("ord", raw, value=value, cls="entity"))
            i += 1
            continue
        if a.suffix in MAGNITUDES:
            value, scaled = value * MAGNITUDES[a.suffix], True
        elif a.suffix in MONEY_MAGNITUDES and (money or _is_currency(nxt)):
            value, scaled = value * MONEY_MAGNITUDES[a.suffix], True
        elif a.suffix:
            units.append(f"unit:{UNIT_CANON.get(a.suffix, a.suffix)}")
        j = i + 1
        while not a.suffix and j < len(atoms) and atoms[j].kind == "mag":  # "5 million"
            value, scaled = value * atoms[j].value, True
            j += 1
        text = _fmt(value) if scaled else (_money_digits(raw) if money else raw)
        out.append(Atom("num", text, [f"n:{text}", *units], value=value, cls="entity"))
        i = j
    return out


def _day(atom: Atom | None) -> int | None:
    if atom is None or atom.kind not in ("num", "ord") or atom.value is None:
        return None
    if len(atom.items) > 1 or (atom.kind == "num" and len(atom.text) > 2):
        return None
    v = atom.value
    return int(v) if v == v.to_integral_value() and 1 <= v <= 31 else None


def _year(atoms: list[Atom], j: int) -> tuple[int, int | None]:
    """An optional year at ``j`` (after an optional comma): (next index, year)."""
    k = j + 1 if j < len(atoms) and atoms[j].text == "," else j
    if k < len(atoms) and atoms[k].kind == "num" and len(atoms[k].text) == 4 \
            and atoms[k].text.isdigit() and 1000 <= int(atoms[k].text) <= 2999:
        return k + 1, int(atoms[k].text)
    return j, None


def _dates(atoms: list[Atom]) -> list[Atom]:
    """Month + day in either order (ordinal or not, "of" or not, a year after) -> one item."""
    out: list[Atom] = []
    i = 0
    while i < len(atoms):
        a = atoms[i]
        nxt = atoms[i + 1] if i + 1 < len(atoms) else None
        month = day = None
        if a.kind == "month" and _day(nxt) is not None:
            month, day, j = int(a.value), _day(nxt), i + 2
        elif _day(a) is not None:
            k = i + 2 if nxt is not None and nxt.text == "of" else i + 1
            if k < len(atoms) and atoms[k].kind == "month":
                month, day, j = int(atoms[k].value), _day(a), k + 1
        if month is None:
            if a.kind == "ord":
                a.items, a.cls = [f"ord:{_fmt(a.value)}"], "entity"
            out.append(a)
            i += 1
            continue
        j, year = _year(atoms, j)
        stamp = f"{year}-{month}-{day}" if year else f"{month}-{day}"
        out.append(Atom("date", stamp, [f"date:{stamp}"], cls="entity"))
        i = j
    return out


def _quantities(atoms: list[Atom]) -> list[Atom]:
    """A number with its currency or unit is one entity ("$ 40,277", "2 kg", "40 euros")."""
    out: list[Atom] = []
    for a in atoms:
        prev = out[-1] if out else None
        if prev is not None and a.cls == "entity" and (
                (prev.kind == "num" and (_is_currency(a) or a.items[0].startswith("unit:")))
                or (a.kind == "num" and _is_currency(prev) and prev.kind != "num")):
            prev.items = prev.items + a.items
            prev.kind = "num"
            continue
        out.append(a)
    return out


def _head(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


# Prepositions that say whose or about what ("the revenue of Acme", "the warranty on SKU-1",
# "the price for Acme"): with one such entity in a question, it is the same entity as the
# bare subject of a rewording ("how much revenue did Acme make").
ASSOCIATIVE = frozenset({"of", "for", "on", "about", "regarding", "concerning"})


def _roles(atoms: list[Atom]) -> tuple[list[str], list[str], int]:
    """Preposition-tagged items and the order of the entities outside any phrase; the
    plain content words outside any phrase, in order ("dog chase cat"), coordinated ones
    ("latency and throughput") as one sorted group; and how many entity groups stand bare or
    in an ``ASSOCIATIVE`` phrase (with at most one, its role cannot be confused with
    another's)."""
    roles: list[str] = []
    groups: list[list[str]] = []           # bare entities in order; coordinated ones together
    words: list[list[str]] = []            # bare plain content words, grouped the same way
    prep, phrase, head = None, [], None    # the open phrase
    coord = False                          # an "and"/"or" just passed
    glued = False                          # the last atom was an entity of the open phrase

    loose = 0

    def close() -> None:
        nonlocal prep, phrase, head, loose
        if prep is not None:
            if phrase and prep in ASSOCIATIVE:
                loose += 1
            if phrase:
                roles.extend(f"{prep}>{item}" for atom_items in phrase for item in atom_items)
            elif head:
                roles.append(f"{prep}>^{head}")
        prep, phrase, head = None, [], None

    for a in atoms:
        was_glued, glued = glued, False
        if a.cls == "prep":
            close()
            prep, coord = a.text, False
        elif a.cls == "coord":
            coord = True
        elif a.cls == "det":
            continue
        elif a.cls == "boundary":
            close()
            coord = False
        elif a.cls == "content":
            if coord:
                close()
            if prep is not None:
                head = _head(a.text)
            elif not a.items:
                if coord and words:
                    words[-1].append(_head(a.text))
                else:
                    words.append([_head(a.text)])
            coord = False
        else:  # entity
            # "in Q1 2025": entities next to each other stay in the phrase they start
            if prep is not None and (not phrase or coord or was_glued):
                phrase.append(a.items)
                glued = True
            else:
                close()
                if coord and groups:
                    groups[-1].append(",".join(sorted(a.items)))
                else:
                    groups.append([",".join(sorted(a.items))])
            coord = False
    close()
    if len(groups) >= 2:
        roles.append("seq:" + ">".join("+".join(sorted(g)) for g in groups))
    return roles, ["+".join(sorted(g)) for g in words], loose + len(groups)


def analyse(norm: str) -> tuple[list[str], list[str], list[str], int]:
    """(entity items, role items, bare content-word order, loose entity groups: see
    ``_roles``) of case-folded text."""
    atoms = _quantities(_dates(_numbers(_atoms(norm))))
    items = [item for a in atoms for item in a.items]
    return items, *_roles(atoms)
