"""Entity signature: the meaning-bearing tokens two prompts must share before a semantic
cache may treat them as the same question (FL-28A).

Everything is case-folded first, so the signature never depends on casing. Named things are
found without capitalisation: a token is a named thing when it is not a common English word
(``data/common_words.txt``, built from a BPE vocabulary, see ``build_common_words.py``) or
when it is in the lexicon of places, months, vendors and regimes below. Capitalised common
words ("Umbrella", "Stark Industries") can only be told apart by casing, so that is a
separate, optional check: ``cased_names`` / ``cased_names_agree``.

The signature is a sorted multiset (a tuple with repeats), so "1 1 2" and "2 1 2" differ.
"""
from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

_WORDS_FILE = Path(__file__).with_name("data") / "common_words.txt"

# Always common even where the vocabulary says otherwise: fillers a paraphrase adds.
_FILLERS = """hi hello hey thanks thank please yes yeah ok okay dear sir madam kindly however
also additionally furthermore meanwhile unfortunately actually basically quick question
tell me could would you i we us our my system general license""".split()


def _load_common() -> frozenset[str]:
    try:
        words = set(_WORDS_FILE.read_text().split())
    except OSError:  # a broken install must not break the cache: fall back to the fillers
        words = set()
    return frozenset(words | set(_FILLERS) | set("abcdefghijklmnopqrstuvwxyz"))


COMMON_WORDS = _load_common()


def _lex(category: str, words: str) -> dict[str, str]:
    return {w: f"{category}:{w}" for w in words.split()}


def _canon(category: str, mapping: dict[str, str]) -> dict[str, str]:
    return {w: f"{category}:{c}" for w, c in mapping.items()}


_NEGATIONS = _lex("neg", """not no never none nobody nothing nowhere neither nor without
except excluding exclude unless non lack lacking unable invalid incorrect inactive unavailable
unsupported illegal impossible""")
_NEGATIONS.update({"cannot": "neg:not", "n't": "neg:not", "nope": "neg:no"})

_COMPARISONS = _lex("cmp", """before after more less fewer greater higher lower above below
over under least most max maximum min minimum increase decrease longer shorter bigger smaller
larger older newer faster slower cheaper earlier later exceed within between since until till
beyond exactly approximately roughly equal plus minus up down""")
_COMPARISONS.update({"greatest": "cmp:most", "highest": "cmp:most", "lowest": "cmp:least",
                     "largest": "cmp:most", "smallest": "cmp:least", "biggest": "cmp:most",
                     "exceeds": "cmp:exceed", "worse": "cmp:worse", "better": "cmp:better",
                     "best": "cmp:best", "worst": "cmp:worst"})

_QUANTIFIERS = _lex("q", """all any some every each only first last top bottom both either few
many several single entire whole half majority minority next previous prior latest oldest
newest second third""")

# Direction words whose antonym would otherwise look like a paraphrase.
_DIRECTIONS = _lex("dir", """enable disable add remove upgrade downgrade import export buy sell
purchase refund charge open close start stop allow deny block unblock include accept reject
approve encrypt decrypt upload download install uninstall login logout push pull win lose lock
unlock create delete send receive credit debit deposit withdraw inbound outbound grant revoke
activate deactivate subscribe unsubscribe increment decrement insert drop read write load
unload enter exit hire fire raise lower pass fail succeed success failure true false on off
in out inc dec positive negative left right""")
_DIRECTIONS.update({"sold": "dir:sell", "bought": "dir:buy", "sent": "dir:send",
                    "lost": "dir:lose", "won": "dir:win", "logged": "dir:login",
                    "log-in": "dir:login", "log-out": "dir:logout"})
for _w in ("in", "on", "left", "right", "pass", "raise", "lower"):
    _DIRECTIONS.pop(_w, None)  # too common as plain prepositions / verbs

_MONTHS = {"january": "1", "jan": "1", "february": "2", "feb": "2", "march": "3", "mar": "3",
           "april": "4", "apr": "4", "may": "5", "june": "6", "jun": "6", "july": "7",
           "jul": "7", "august": "8", "aug": "8", "september": "9", "sep": "9", "sept": "9",
           "october": "10", "oct": "10", "november": "11", "nov": "11", "december": "12",
           "dec": "12"}
_WEEKDAYS = {"monday": "mon", "mon": "mon", "tuesday": "tue", "tue": "tue", "tues": "tue",
             "wednesday": "wed", "wed": "wed", "thursday": "thu", "thu": "thu", "thur": "thu",
             "thurs": "thu", "friday": "fri", "fri": "fri", "saturday": "sat",
             "sunday": "sun"}
_DATES = {**_canon("month", _MONTHS), **_canon("day", _WEEKDAYS), **_lex("when", """today
tonight tomorrow yesterday weekend weekday morning afternoon evening night midnight noon daily
weekly monthly quarterly yearly annually annual hourly ago overnight fortnight""")}

_CURRENCIES = _canon("cur", {
    "$": "usd", "usd": "usd", "dollar": "usd", "dollars": "usd", "buck": "usd", "bucks": "usd",
    "€": "eur", "eur": "eur", "euro": "eur", "euros": "eur", "£": "gbp", "gbp": "gbp",
    "sterling": "gbp", "pound": "pound", "pounds": "pound", "¥": "jpy", "jpy": "jpy",
    "yen": "jpy", "yuan": "cny", "cny": "cny", "rmb": "cny", "renminbi": "cny", "₹": "inr",
    "inr": "inr", "rupee": "inr", "rupees": "inr", "₩": "krw", "krw": "krw", "₽": "rub",
    "rub": "rub", "ruble": "rub", "rubles": "rub", "¢": "cent", "cent": "cent", "cents": "cent",
    "penny": "pence", "pence": "pence", "₿": "btc", "btc": "btc", "bitcoin": "btc",
    "cad": "cad", "aud": "aud", "chf": "chf", "franc": "chf", "francs": "chf", "sek": "sek",
    "nok": "nok", "dkk": "dkk", "brl": "brl", "mxn": "mxn", "peso": "mxn", "pesos": "mxn",
    "zar": "zar", "rand": "zar", "sgd": "sgd", "hkd": "hkd", "nzd": "nzd", "₺": "try",
    "lira": "try", "₪": "ils", "shekel": "ils", "ils": "ils", "eth": "eth", "usdc": "usdc"})

_UNIT_CANON = {
    "kg": "kg", "kgs": "kg", "kilogram": "kg", "kilograms": "kg", "g": "g", "gram": "g",
    "grams": "g", "mg": "mg", "milligram": "mg", "lb": "lb", "lbs": "lb", "oz": "oz",
    "ounce": "oz", "ounces": "oz", "ton": "t", "tons": "t", "tonne": "t", "tonnes": "t",
    "km": "km", "kilometer": "km", "kilometers": "km", "kilometre": "km", "m": "m",
    "meter": "m", "meters": "m", "metre": "m", "metres": "m", "cm": "cm", "mm": "mm",
    "mi": "mi", "mile": "mi", "miles": "mi", "ft": "ft", "foot": "ft", "feet": "ft",
    "inch": "in", "inches": "in", "yd": "yd", "yard": "yd", "yards": "yd", "l": "l",
    "liter": "l", "liters": "l", "litre": "l", "litres": "l", "ml": "ml", "gal": "gal",
    "gallon": "gal", "gallons": "gal", "b": "b", "byte": "b", "bytes": "b", "bit": "bit",
    "bits": "bit", "kb": "kb", "mb": "mb", "gb": "gb", "tb": "tb", "pb": "pb", "kib": "kib",
    "mib": "mib", "gib": "gib", "tib": "tib", "kilobyte": "kb", "megabyte": "mb",
    "megabytes": "mb", "gigabyte": "gb", "gigabytes": "gb", "terabyte": "tb",
    "terabytes": "tb", "kbps": "kbps", "mbps": "mbps", "gbps": "gbps", "hz": "hz",
    "khz": "khz", "mhz": "mhz", "ghz": "ghz", "w": "w", "watt": "w", "watts": "w", "kw": "kw",
    "mw": "mw", "kwh": "kwh", "v": "v", "volt": "v", "volts": "v", "ms": "ms",
    "millisecond": "ms", "milliseconds": "ms", "us": "us", "ns": "ns", "s": "s", "sec": "s",
    "secs": "s", "second": "s", "seconds": "s", "min": "min", "mins": "min", "minute": "min",
    "minutes": "min", "h": "h", "hr": "h", "hrs": "h", "hour": "h", "hours": "h", "d": "d",
    "day": "d", "days": "d", "wk": "wk", "wks": "wk", "week": "wk", "weeks": "wk",
    "mo": "mo", "month": "mo", "months": "mo", "yr": "yr", "yrs": "yr", "year": "yr",
    "years": "yr", "quarter": "qtr", "quarters": "qtr", "decade": "decade",
    "decades": "decade", "%": "%", "percent": "%", "pct": "%", "percentage": "%",
    "°": "deg", "c": "c", "f": "f", "celsius": "c", "fahrenheit": "f", "kelvin": "k",
    "rpm": "rpm", "qps": "qps", "rps": "rps", "tps": "tps", "k": "k", "x": "x",
    "am": "am", "pm": "pm", "st": "ord", "nd": "ord", "rd": "ord", "th": "ord",
    "thousand": "k", "million": "mn", "millions": "mn", "billion": "bn", "billions": "bn",
    "trillion": "tn", "bn": "bn", "mn": "mn", "token": "tok", "tokens": "tok",
    "user": "user", "users": "user", "seat": "seat", "seats": "seat", "core": "core",
    "cores": "core", "vcpu": "vcpu", "vcpus": "vcpu", "gpu": "gpu", "gpus": "gpu",
    "node": "node", "nodes": "node", "replica": "replica", "replicas": "replica"}
# Short or ordinary-word units count only right after a number ("5 m", "3 users").
_BOUND_ONLY = {w for w in _UNIT_CANON if len(w) <= 2 or w in {
    "user", "users", "seat", "seats", "core", "cores", "node", "nodes", "replica", "replicas",
    "token", "tokens", "bit", "bits", "sec", "min", "mins", "rand", "us"}}
_UNITS = {w: f"unit:{c}" for w, c in _UNIT_CANON.items()}

_NUMBER_WORDS = {w: f"n:{i}" for i, w in enumerate("""zero one two three four five six seven
eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen
twenty""".split())}
_NUMBER_WORDS.update({w: f"n:{(i + 3) * 10}" for i, w in enumerate(
    "thirty forty fifty sixty seventy eighty ninety".split())})
_NUMBER_WORDS.update({"hundred": "n:100", "dozen": "n:12", "once": "n:x1", "twice": "n:x2",
                      "double": "n:x2", "triple": "n:x3", "single": "n:x1", "half": "n:0.5",
                      "quadruple": "n:x4"})

_PLACES = """afghanistan albania algeria argentina armenia australia austria azerbaijan bahrain
bangladesh belarus belgium bolivia bosnia brazil bulgaria cambodia cameroon canada chad chile
china colombia croatia cuba cyprus czechia denmark ecuador egypt estonia ethiopia finland france
georgia germany ghana greece guatemala haiti honduras hungary iceland india indonesia iran iraq
ireland israel italy jamaica japan jordan kazakhstan kenya korea kuwait laos latvia lebanon
libya lithuania luxembourg malaysia mali malta mexico moldova monaco mongolia montenegro morocco
mozambique myanmar nepal netherlands holland nicaragua niger nigeria norway oman pakistan panama
paraguay peru philippines poland portugal qatar romania russia rwanda senegal serbia singapore
slovakia slovenia somalia spain sudan sweden switzerland syria taiwan tanzania thailand tunisia
turkey uganda ukraine uruguay uzbekistan venezuela vietnam yemen zambia zimbabwe england
scotland wales britain uk usa america europe asia africa oceania antarctica emea apac latam
alabama alaska arizona arkansas california colorado connecticut delaware florida hawaii idaho
illinois indiana iowa kansas kentucky louisiana maine maryland massachusetts michigan minnesota
mississippi missouri montana nebraska nevada ohio oklahoma oregon pennsylvania tennessee texas
utah vermont virginia washington wisconsin wyoming dakota carolina hampshire jersey york
quebec ontario alberta manitoba bavaria catalonia
london paris berlin madrid rome milan munich frankfurt hamburg amsterdam brussels vienna zurich
geneva stockholm oslo copenhagen helsinki dublin lisbon prague warsaw budapest athens istanbul
moscow dubai mumbai delhi bangalore bengaluru chennai tokyo osaka seoul beijing shanghai
shenzhen hongkong taipei manila jakarta bangkok hanoi sydney melbourne brisbane perth auckland
toronto vancouver montreal ottawa calgary boston chicago denver dallas houston austin phoenix
seattle portland miami atlanta detroit orlando tampa nashville memphis charlotte baltimore
philadelphia pittsburgh cleveland cincinnati columbus indianapolis milwaukee minneapolis omaha
sacramento oakland san francisco diego jose los angeles vegas albuquerque tucson boise
anchorage honolulu raleigh richmond reno salem buffalo newark lagos nairobi cairo johannesburg
capetown riyadh doha tehran karachi lima bogota santiago sao paulo rio buenos aires
north south east west central northeast northwest southeast southwest midwest"""

_VENDORS = """aws amazon azure microsoft google gcp apple meta facebook oracle ibm sap salesforce
stripe paypal visa mastercard amex shopify slack zoom okta github gitlab atlassian jira
confluence datadog snowflake databricks twilio openai anthropic mistral cohere nvidia intel amd
arm qualcomm samsung sony dell hp lenovo cisco vmware redhat ubuntu debian linux windows macos
ios android chrome firefox safari postgres postgresql mysql redis mongodb kafka kubernetes
docker terraform ansible jenkins vercel netlify heroku cloudflare akamai fastly dropbox box
notion asana hubspot zendesk intercom workday servicenow tableau looker excel outlook gmail
teams sharepoint onedrive iphone ipad pixel galaxy tesla uber lyft airbnb netflix spotify
walmart target costco ebay alibaba tencent baidu huawei xiaomi
hipaa gdpr ccpa cpra sox pci dss soc iso nist fips fedramp glba coppa ferpa dora nis lgpd pipeda
hitrust cmmc itar ear""" 

_NAMED = {w: f"name:{w}" for w in (_PLACES + " " + _VENDORS).split()}
# Two-word names whose first word is common and whose second is also a standalone name.
_BIGRAMS = {("new", w) for w in ("york", "jersey", "mexico", "hampshire", "zealand", "delhi",
                                  "orleans", "england", "south")} | {
    ("hong", "kong"), ("los", "angeles"), ("san", "francisco"), ("san", "diego"),
    ("san", "jose"), ("west", "virginia"), ("north", "carolina"), ("south", "carolina"),
    ("north", "dakota"), ("south", "dakota"), ("north", "korea"), ("south", "korea"),
    ("south", "africa"), ("united", "states"), ("united", "kingdom"), ("saudi", "arabia")}

LEXICON: dict[str, str] = {**_NAMED, **_DIRECTIONS, **_QUANTIFIERS, **_DATES, **_COMPARISONS,
                           **_NUMBER_WORDS, **_CURRENCIES, **_UNITS, **_NEGATIONS}

_TOKEN_RE = re.compile(r"""
    (?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?)                       # 40,277  1,000.50
  | (?P<word>[^\W_]+(?:'[^\W_]+)*(?:[-_./:@+][^\W_]+(?:'[^\W_]+)*)*)  # words, ids, v2.3, dates
  | (?P<sym>[$€£¥₹₩₽¢₿₺₪%°])
""", re.X)
_NUM_UNIT_RE = re.compile(r"^(\d+(?:\.\d+)?)([a-z%]+)$")
_DIGIT_RE = re.compile(r"\d")
_ID_SEP_RE = re.compile(r"(?<=[^\W\d_])[-_](?=\d)|(?<=\d)[-_](?=[^\W\d_])")
_CONTRACTIONS = ("'s", "'ll", "'re", "'ve", "'d", "'m", "'")
_SUFFIXES = ("ing", "ed", "es", "s", "d", "ly", "er")


def normalise_text(text: str) -> str:
    """NFKC, typographic quotes to ASCII, case-folded, single spaces."""
    text = unicodedata.normalize("NFKC", text or "").replace("\u2019", "'").replace("\u2018", "'")
    return " ".join(text.casefold().split())


@lru_cache(maxsize=65536)
def _lemma_candidates(word: str) -> tuple[str, ...]:
    out = [word]
    for suf in _SUFFIXES:
        if word.endswith(suf) and len(word) - len(suf) >= 3:
            base = word[: -len(suf)]
            out += [base, base + "e"]
            if len(base) >= 4 and base[-1] == base[-2]:  # stopped -> stop
                out.append(base[:-1])
            if base.endswith("i"):  # studies -> study
                out.append(base[:-1] + "y")
    return tuple(out)


def _lookup(word: str) -> str | None:
    for cand in _lemma_candidates(word):
        hit = LEXICON.get(cand)
        if hit is not None:
            return hit
    return None


def _is_common(word: str) -> bool:
    return any(c in COMMON_WORDS for c in _lemma_candidates(word))


def _word_items(word: str, prev_was_number: bool) -> list[str]:
    """Entity items for one alphabetic (digit-free) token."""
    if word.endswith("n't"):
        return ["neg:not"]
    hit = LEXICON.get(word) or (_lookup(word) if len(word) > 3 else None)
    if hit is not None and hit.startswith("unit:") and word in _BOUND_ONLY and not prev_was_number:
        hit = None
    if hit is not None:
        return [hit]
    return [] if _is_common(word) else [f"name:{word}"]


def _strip_contraction(word: str) -> str:
    if word.endswith("n't") or "'" not in word:
        return word
    for suf in _CONTRACTIONS:
        if word.endswith(suf):
            return word[: -len(suf)]
    return word


def _number_items(tok: str) -> list[str]:
    tok = _ID_SEP_RE.sub("", tok.replace(",", ""))
    m = _NUM_UNIT_RE.match(tok)
    if m and m.group(2) in _UNIT_CANON:
        return [f"n:{m.group(1)}", f"unit:{_UNIT_CANON[m.group(2)]}"]
    return [f"n:{tok}"]


def _items(norm: str) -> list[str]:
    items: list[str] = []
    toks = [(m.lastgroup, m.group()) for m in _TOKEN_RE.finditer(norm)]
    prev_number = False
    prev_word = ""
    for kind, tok in toks:
        if kind == "sym":
            items.append(LEXICON.get(tok, f"sym:{tok}"))
            prev_number = False
            continue
        tok = _strip_contraction(tok)
        if not tok:
            continue
        if kind == "num" or _DIGIT_RE.search(tok):
            items.extend(_number_items(tok))
            prev_number, prev_word = True, ""
            continue
        if "@" in tok or "." in tok or "/" in tok or ":" in tok:
            items.append(f"name:{tok}")  # domains, emails, paths: keep whole
            prev_number, prev_word = False, ""
            continue
        parts = [p for p in re.split(r"[-_+]", tok) if p]
        for part in parts:
            if (prev_word, part) in _BIGRAMS:
                items.append(f"name:{prev_word} {part}")
            items.extend(_word_items(part, prev_number))
            prev_number = False
            prev_word = part
    return items


def entity_signature(text: str) -> tuple[str, ...]:
    """Sorted multiset of normalised entity items, e.g. ``('cur:usd', 'n:40277', 'name:soylent')``."""
    return tuple(sorted(_items(normalise_text(text))))


def entity_signature_hash(text: str) -> str:
    sig = entity_signature(text)
    return hashlib.sha256("\x1f".join(sig).encode()).hexdigest()[:32]


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
            if part and part != "i" and _is_common(part) and part not in _FILLERS:
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


def content_words(text: str) -> frozenset[str]:
    """Common content words (folded, plural -s dropped): what a word swap would change."""
    out: set[str] = set()
    for m in _TOKEN_RE.finditer(normalise_text(text)):
        if m.lastgroup != "word":
            continue
        tok = _strip_contraction(m.group())
        if _DIGIT_RE.search(tok) or tok.endswith("n't"):
            continue
        for part in re.split(r"[-_./:@+]", tok):
            if len(part) < 2 or part in _STOPWORDS or part in LEXICON or not _is_common(part):
                continue
            if len(part) > 3 and part.endswith("s") and not part.endswith("ss"):
                part = part[:-1]
            out.add(part)
    return frozenset(out)


def content_compatible(a: frozenset[str], b: frozenset[str]) -> bool:
    """False when each side has a content word the other lacks (a swap, not an addition)."""
    return not (a - b) or not (b - a)


@dataclass(frozen=True)
class EntityProfile:
    """What the semantic cache keeps about a prompt besides its embedding."""
    signature_hash: str
    cased: frozenset[str] | None
    content: frozenset[str]

    def to_dict(self) -> dict:
        return {"sig": self.signature_hash,
                "cased": None if self.cased is None else sorted(self.cased),
                "content": sorted(self.content)}

    @classmethod
    def from_dict(cls, d: dict) -> "EntityProfile":
        cased = d.get("cased")
        return cls(d["sig"], None if cased is None else frozenset(cased),
                   frozenset(d.get("content") or ()))


def entity_profile(text: str) -> EntityProfile:
    return EntityProfile(entity_signature_hash(text), cased_names(text), content_words(text))


def profiles_compatible(a: EntityProfile, b: EntityProfile) -> bool:
    """The whole guard: same signature, casing does not contradict, no content-word swap."""
    return (a.signature_hash == b.signature_hash and cased_names_agree(a.cased, b.cased)
            and content_compatible(a.content, b.content))
