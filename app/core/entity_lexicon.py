"""Word lists of the entity signature (``app.core.entities``): what each word means to
the cache guard. Pure data; everything here is lower-case (text is case-folded first)."""
from __future__ import annotations

from pathlib import Path

WORDS_FILE = Path(__file__).with_name("data") / "common_words.txt"

# Always common even where the vocabulary says otherwise: fillers a paraphrase adds.
FILLERS = """hi hello hey thanks thank please yes yeah ok okay dear sir madam kindly however
also additionally furthermore meanwhile unfortunately actually basically quick question
tell me could would you i we us our my system general license""".split()


# Ordinary business words the vocabulary lacks (so they would read as names).
EXTRA_COMMON = """headcount staffing receivables payables onboarding offboarding""".split()


def _load_common() -> frozenset[str]:
    try:
        words = set(WORDS_FILE.read_text().split())
    except OSError:  # a broken install must not break the cache: fall back to the fillers
        words = set()
    return frozenset(words | set(FILLERS) | set(EXTRA_COMMON) | set("abcdefghijklmnopqrstuvwxyz"))


COMMON_WORDS = _load_common()


def _lex(category: str, words: str) -> dict[str, str]:
    return {w: f"{category}:{w}" for w in words.split()}


def _canon(category: str, mapping: dict[str, str]) -> dict[str, str]:
    return {w: f"{category}:{c}" for w, c in mapping.items()}


_NEGATIONS = _lex("neg", """not no never none nobody nothing nowhere neither nor without
except excluding exclude unless non lack lacking unable invalid incorrect inactive unavailable
unsupported illegal impossible""")
_NEGATIONS.update({"cannot": "neg:not", "n't": "neg:not", "nope": "neg:no"})

# "n't" forms, also typed without the apostrophe ("dont", "cant"): the modal they carry.
# Each is read as that modal plus neg:not, so "can't" = "cant" = "cannot" = "can not".
NT_FORMS = {"can": "can", "ca": "can", "could": "can", "might": "can", "wo": "will",
            "would": "will", "sha": "will", "should": "should", "must": "should",
            "need": "", "do": "", "does": "", "did": "", "is": "", "are": "", "was": "",
            "were": "", "have": "", "has": "", "had": "", "ai": ""}
NO_APOSTROPHE = {"cant": "can", "cannot": "can", "couldnt": "can", "mightnt": "can",
                 "wont": "will", "wouldnt": "will", "shant": "will", "shouldnt": "should",
                 "mustnt": "should", "dont": "", "doesnt": "", "didnt": "", "isnt": "",
                 "arent": "", "wasnt": "", "werent": "", "havent": "", "hasnt": "",
                 "hadnt": "", "aint": "", "neednt": ""}

_COMPARISONS = _lex("cmp", """before after more less fewer greater higher lower above below
over under least most max maximum min minimum increase decrease longer shorter bigger smaller
larger older newer faster slower cheaper earlier later exceed within between since until till
beyond exactly approximately roughly equal plus minus up down""")
# Bounds read alike whichever word says them ("more than 5" = "over 5" = "above 5").
_COMPARISONS.update({w: "cmp:gt" for w in ("more", "over", "above", "greater", "exceed",
                                            "exceeds", "beyond")})
_COMPARISONS.update({w: "cmp:lt" for w in ("less", "fewer", "under", "below")})
_COMPARISONS.update({"greatest": "cmp:most", "highest": "cmp:most", "lowest": "cmp:least",
                     "largest": "cmp:most", "smallest": "cmp:least", "biggest": "cmp:most",
                     "exceeds": "cmp:exceed", "worse": "cmp:worse", "better": "cmp:better",
                     "best": "cmp:best", "worst": "cmp:worst"})

_QUANTIFIERS = _lex("q", """all any some every each only last top bottom both either few
many several single entire whole half majority minority next previous prior latest oldest
newest""")

# Direction words whose antonym would otherwise look like a paraphrase.
_DIRECTIONS = _lex("dir", """enable disable add remove upgrade downgrade import export buy sell
purchase refund charge open close start stop allow deny block unblock include accept reject
approve encrypt decrypt upload download install uninstall login logout push pull win lose lock
unlock create delete send receive credit debit deposit withdraw inbound outbound grant revoke
activate deactivate subscribe unsubscribe increment decrement insert drop read write load
unload enter exit hire fire raise lower pass fail succeed success failure true false on off
in out inc dec positive negative left right""")
_DIRECTIONS.update({"purchase": "dir:buy", "sold": "dir:sell", "bought": "dir:buy", "sent": "dir:send",
                    "lost": "dir:lose", "won": "dir:win", "logged": "dir:login",
                    "log-in": "dir:login", "log-out": "dir:logout"})
for _w in ("in", "on", "left", "right", "pass", "raise", "lower"):
    _DIRECTIONS.pop(_w, None)  # too common as plain prepositions / verbs

MONTHS = {"january": "1", "jan": "1", "february": "2", "feb": "2", "march": "3", "mar": "3",
           "april": "4", "apr": "4", "may": "5", "june": "6", "jun": "6", "july": "7",
           "jul": "7", "august": "8", "aug": "8", "september": "9", "sep": "9", "sept": "9",
           "october": "10", "oct": "10", "november": "11", "nov": "11", "december": "12",
           "dec": "12"}
_WEEKDAYS = {"monday": "mon", "mon": "mon", "tuesday": "tue", "tue": "tue", "tues": "tue",
             "wednesday": "wed", "wed": "wed", "thursday": "thu", "thu": "thu", "thur": "thu",
             "thurs": "thu", "friday": "fri", "fri": "fri", "saturday": "sat",
             "sunday": "sun"}
_DATES = {**_canon("month", MONTHS), **_canon("day", _WEEKDAYS), **_lex("when", """today
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
    "rpm": "rpm", "qps": "qps", "rps": "rps", "tps": "tps", "x": "x",
    "am": "am", "pm": "pm", "token": "tok", "tokens": "tok",
    "user": "user", "users": "user", "seat": "seat", "seats": "seat", "core": "core",
    "cores": "core", "vcpu": "vcpu", "vcpus": "vcpu", "gpu": "gpu", "gpus": "gpu",
    "node": "node", "nodes": "node", "replica": "replica", "replicas": "replica"}
# Short or ordinary-word units count only right after a number ("5 m", "3 users").
_BOUND_ONLY = {w for w in _UNIT_CANON if len(w) <= 2 or w in {
    "user", "users", "seat", "seats", "core", "cores", "node", "nodes", "replica", "replicas",
    "token", "tokens", "bit", "bits", "sec", "min", "mins", "rand", "us", "second", "minute",
    "day", "week", "month", "year", "quarter"}}
UNIT_CANON, BOUND_ONLY = _UNIT_CANON, _BOUND_ONLY

# Number words are combined into one number ("twenty-one" = 21, "five thousand" = 5000).
NUMBER_WORDS = {w: i for i, w in enumerate("""zero one two three four five six seven eight nine
ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen""".split())}
NUMBER_WORDS.update({w: (i + 2) * 10 for i, w in enumerate(
    "twenty thirty forty fifty sixty seventy eighty ninety".split())})
# Scales after a number ("5 thousand", "5k", "2.5bn"). "m", "b" and "t" mean million,
# billion, trillion only next to money ("$5m", "5m usd"); otherwise metres, bytes, tonnes.
MAGNITUDES = {"hundred": 100, "thousand": 1000, "k": 1000, "grand": 1000, "million": 10**6,
              "millions": 10**6, "mn": 10**6, "mio": 10**6, "billion": 10**9,
              "billions": 10**9, "bn": 10**9, "trillion": 10**12, "tn": 10**12}
MONEY_MAGNITUDES = {"m": 10**6, "mm": 10**6, "b": 10**9, "t": 10**12}
ORDINAL_WORDS = {w: i + 1 for i, w in enumerate("""first second third fourth fifth sixth
seventh eighth ninth tenth eleventh twelfth""".split())}
ORDINAL_SUFFIXES = ("st", "nd", "rd", "th")
_NUMBER_WORDS = {"dozen": "n:12", "once": "n:x1", "twice": "n:x2", "double": "n:x2",
                 "triple": "n:x3", "single": "n:x1", "half": "n:0.5", "quadruple": "n:x4"}

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
hitrust cmmc itar ear
python java javascript typescript rust kotlin ruby php scala haskell perl golang elixir erlang
clojure fortran cobol matlab julia lua dart swift csharp cpp ocaml fsharp groovy powershell"""

_NAMED = {w: f"name:{w}" for w in (_PLACES + " " + _VENDORS).split()}

# Function words whose swap changes the question ("how" vs "why", "my" vs "your", "can" vs
# "should", "and" vs "or"). "what" stays untagged: it is the default question word.
_FUNCTION = {**_lex("wh", "when where why how which"), "who": "wh:who", "whom": "wh:who",
             "whose": "wh:who", "or": "conj:or",
             **_canon("pr", {"i": "1s", "my": "1s", "mine": "1s", "myself": "1s", "we": "1p",
                             "our": "1p", "ours": "1p", "ourselves": "1p", "you": "2",
                             "your": "2", "yours": "2", "yourself": "2", "he": "3m",
                             "him": "3m", "his": "3m", "himself": "3m", "she": "3f",
                             "her": "3f", "hers": "3f", "herself": "3f", "they": "3p",
                             "them": "3p", "their": "3p", "theirs": "3p"}),
             **_canon("mod", {"can": "can", "could": "can", "might": "can", "should": "should",
                              "must": "should", "ought": "should", "will": "will",
                              "would": "will", "shall": "will"})}
_ORDINALS = {w: f"ord:{i}" for w, i in ORDINAL_WORDS.items()}
# Two-word names whose first word is common and whose second is also a standalone name.
BIGRAMS = {("new", w) for w in ("york", "jersey", "mexico", "hampshire", "zealand", "delhi",
                                  "orleans", "england", "south")} | {
    ("hong", "kong"), ("los", "angeles"), ("san", "francisco"), ("san", "diego"),
    ("san", "jose"), ("west", "virginia"), ("north", "carolina"), ("south", "carolina"),
    ("north", "dakota"), ("south", "dakota"), ("north", "korea"), ("south", "korea"),
    ("south", "africa"), ("united", "states"), ("united", "kingdom"), ("saudi", "arabia")}

# Word -> item, units aside (``UNIT_CANON``: a unit counts only where ``BOUND_ONLY`` allows).
LEXICON: dict[str, str] = {**_NAMED, **_DIRECTIONS, **_QUANTIFIERS, **_DATES, **_COMPARISONS,
                           **_ORDINALS, **_NUMBER_WORDS, **_CURRENCIES, **_FUNCTION,
                           **_NEGATIONS, **{w: "neg:not" for w in NO_APOSTROPHE}}
CURRENCY_ITEMS = frozenset(_CURRENCIES.values())

# Roles: English marks who-does-what-to-whom by prepositions and word order. An entity after
# one of these is tagged with it ("to:cur:eur"); entities outside any such phrase keep their
# order ("Alice paid Bob" vs "Bob paid Alice").
PREPOSITIONS = frozenset("""about above across after against along among around as at before
behind below beneath beside between beyond by despite during except for from in inside into
like near of off on onto outside over past per since than through throughout till to toward
towards under underneath until unto upon versus via vs with within without""".split())
# Skipped inside a phrase ("to the invoice currency").
DETERMINERS = frozenset("""the a an this that these those some any each every all no my your
our his her their its such another other own same""".split())
# End a phrase: verbs of being/doing, question words, modals, conjunctions, relativisers.
BOUNDARIES = frozenset("""is are was were be been being am do does did done have has had having
what when where why how which who whom whose whether if unless because while so but and or nor
yet then can could may might will would shall should must ought please i we you he she they it
me us him them not never""".split())
COORDINATORS = frozenset({"and", "or", "&"})
# "plan A", "option B": a single letter after one of these is a label, not an article.
LABEL_NOUNS = frozenset("""plan option type class tier grade group section part building phase
version level model series vitamin schedule exhibit appendix annex zone team room gate wing
block lot unit step stage round track lane row column category line route floor figure table
item case scenario variant test form door terminal hall sheet side batch cohort bucket region
shift squad site server cluster node account product package bundle""".split())

