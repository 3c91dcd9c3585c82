"""Writes bench/data/cache_devset.jsonl: the verified cache's development set (issue 22).

3,120 pairs ``{"a", "b", "same", "kind"}`` of 13 kinds, 240 each, from hand-written
templates and value lists below (our own wording, not the seed's) with a fixed seed, so the
file is reproducible. ``same`` says whether one answer serves both questions.

Should hit (same = true):
  synonym            reworded with other words or another question shape
                     ("How many employees does X have in Y?" / "What is the number of ...")
  reorder            the same clauses in another order ("In Y, what ..." / "What ... in Y?")
  surface            case, whitespace, punctuation, a greeting or filler phrase
  doc_greeting       the same pasted document under another greeting
Must never hit (same = false):
  role_swap          who does what to whom swapped ("did A sue B" / "did B sue A")
  antonym            an opposite word, no "not" (include/exclude, before/after, profit/loss)
  unit               the same number with another unit or currency
  bound              another bound on the same number (more than / fewer than)
  number_words       numbers written in words (or mixed), with another value
  doc_figure         one figure changed deep inside a pasted document
  language           the same question in another language
  code_language      the same code request in another programming language
  code_order         the same code steps in another order

    .venv/bin/python bench/data/make_cache_devset.py
"""
from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).with_name("cache_devset.jsonl")
PER_KIND = 240
SEED = 2022

_PRE = "Vant Quor Zent Brim Calv Dorn Exov Fenn Gral Halv Istr Jorv Kest Lumb Morv Nexo Orbr " \
       "Pell Quin Rask Selv Tork Ulv Vesp Wexl Yarn Zolv".split()
_SUF = "rix vel aro lock exa feld ia ick ith ora ent ant os ara ene ux".split()
COMPANIES = [p + s for p in _PRE for s in _SUF]
PEOPLE = """Priya Okafor Lindqvist Tanaka Moreau Haddad Kowalski Nakamura Oyelaran Brennan
Castellano Duarte Fischer Ibrahim Jovanovic Keller Larsen Mbeki Novak Petrov Quintero Rossi
Sandoval Takahashi Varga Wojcik Yilmaz Zhou""".split()
PLACES = """Ohio Texas Denver Lisbon Oslo Austin Seattle Toronto Munich Dublin Osaka Madrid
Vienna Boston Chicago Phoenix Atlanta Warsaw Prague Helsinki Zurich Nairobi Lagos Sydney
Melbourne Auckland Montreal Calgary Florida Oregon Nevada Arizona Kansas Utah Iowa""".split()
FEATURES = ["priority support", "single sign-on", "audit logs", "data export", "custom domains",
            "usage alerts", "API access", "offline mode", "team billing", "role management"]
LANGS = ["Python", "JavaScript", "TypeScript", "Rust", "Java", "Kotlin", "Ruby", "PHP", "C#",
         "Swift", "Haskell", "Scala", "Perl", "Bash", "Golang", "Elixir"]
TASKS = ["parses a CSV file and returns the rows as dictionaries",
         "reverses a singly linked list in place", "checks whether a string is a palindrome",
         "merges two sorted arrays into one sorted array", "counts word frequencies in a text",
         "validates an email address with a regular expression",
         "computes the median of a list of numbers", "flattens a nested list",
         "converts a Unix timestamp to an ISO 8601 date", "finds the longest common prefix",
         "retries an HTTP request with exponential backoff", "deduplicates a list of records"]
STEPS = [("sorts the list", "removes duplicates"), ("parses the JSON", "validates it against the schema"),
         ("compresses the file", "encrypts it"), ("trims each line", "drops empty lines"),
         ("rounds each price", "sums the prices"), ("signs the payload", "base64-encodes it"),
         ("lowercases every word", "counts distinct words"),
         ("filters out refunds", "takes the first ten orders"),
         ("normalises the vector", "adds the bias"), ("truncates the text", "escapes HTML")]
SPELLED = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven",
           8: "eight", 9: "nine", 10: "ten", 11: "eleven", 12: "twelve", 15: "fifteen",
           20: "twenty", 25: "twenty-five", 30: "thirty", 40: "forty", 45: "forty-five",
           50: "fifty", 60: "sixty", 75: "seventy-five", 90: "ninety", 100: "a hundred",
           200: "two hundred", 300: "three hundred", 500: "five hundred",
           1000: "one thousand", 2000: "two thousand", 5000: "five thousand"}


class Slots:
    """Random slot values for one pair."""

    def __init__(self, rng: random.Random) -> None:
        c1, c2 = rng.sample(COMPANIES, 2)
        p1, p2 = rng.sample(PEOPLE, 2)
        self.d = {"C": c1, "C2": c2, "P": rng.choice(PLACES), "P2": rng.choice(PLACES),
                  "SKU": f"SKU-{rng.randint(1000, 9999)}", "ORD": f"ORD-{rng.randint(10000, 99999)}",
                  "INV": f"INV-{rng.randint(1000, 9999)}", "TCK": f"TCK-{rng.randint(100, 999)}",
                  "Y": str(rng.randint(2018, 2027)), "Q": f"Q{rng.randint(1, 4)}",
                  "N": str(rng.choice([3, 5, 8, 12, 20, 25, 40, 50, 75, 120, 250, 500])),
                  "PER": p1, "PER2": p2, "F": rng.choice(FEATURES),
                  "M": rng.choice(["March", "April", "June", "September", "November"]),
                  "D": str(rng.randint(2, 27))}

    def fill(self, template: str) -> str:
        return template.format(**self.d)


SYNONYM = [
    ("How many employees does {C} have in {P}?", "What is the number of employees {C} has in {P}?"),
    ("How many employees does {C} have in {P}?", "What is the headcount of {C} in {P}?"),
    ("What does {SKU} cost?", "What is the price of {SKU}?"),
    ("How much does {SKU} cost in {P}?", "What is the price of {SKU} in {P}?"),
    ("When did order {ORD} ship?", "What was the shipping date of order {ORD}?"),
    ("How much revenue did {C} make in {Y}?", "What was the revenue of {C} in {Y}?"),
    ("Why was invoice {INV} rejected?", "What is the reason invoice {INV} was rejected?"),
    ("How long is the warranty on {SKU}?", "What is the warranty period for {SKU}?"),
    ("Where is the headquarters of {C}?", "In which city is the headquarters of {C}?"),
    ("How many tickets did {C} open in {Q} {Y}?", "What is the count of tickets {C} opened in {Q} {Y}?"),
    ("List the unpaid invoices of {C}.", "Show the unpaid invoices of {C}."),
    ("Summarise ticket {TCK}.", "Give me a summary of ticket {TCK}."),
    ("When does the contract with {C} expire?", "What is the expiry date of the contract with {C}?"),
    ("How many seats does {C} use?", "What is the total number of seats {C} uses?"),
    ("What is the cost of {N} seats for {C}?", "How much do {N} seats cost for {C}?"),
    ("Who is the account manager of {C}?", "Which person is the account manager of {C}?"),
    ("How many orders did {C} place in {Y}?", "What was the number of orders {C} placed in {Y}?"),
    ("What is the delivery time to {P} for order {ORD}?",
     "How long does delivery to {P} take for order {ORD}?"),
    ("Does the {C} plan come with {SP} seats?", "Does the {C} plan come with {NUM} seats?"),
    ("Can we buy {SP} licences for {C}?", "Can we purchase {NUM} licences for {C}?"),
    ("How much did {C} spend on shipping in {Y}?", "What was the shipping spend of {C} in {Y}?"),
    ("What is the status of ticket {TCK}?", "What is the current status of ticket {TCK}?"),
    ("How many customers does {C} have in {P}?", "What is the customer count of {C} in {P}?"),
    ("How big is the refund for order {ORD}?", "What is the size of the refund for order {ORD}?"),
]
REORDER = [
    ("In {P}, how many employees does {C} have?", "How many employees does {C} have in {P}?"),
    ("For {SKU}, what is the warranty period?", "What is the warranty period for {SKU}?"),
    ("During {Y}, what was the revenue of {C}?", "What was the revenue of {C} during {Y}?"),
    ("For order {ORD}, what is the shipping cost to {P}?", "What is the shipping cost to {P} for order {ORD}?"),
    ("In {Q} {Y}, how many tickets did {C} close?", "How many tickets did {C} close in {Q} {Y}?"),
    ("On the {C} plan, is {F} included?", "Is {F} included on the {C} plan?"),
    ("For invoice {INV}, when is the payment due?", "When is the payment due for invoice {INV}?"),
    ("In {P}, what is the return policy for {SKU}?", "What is the return policy for {SKU} in {P}?"),
    ("Within the {C} account, who approves refunds?", "Who approves refunds within the {C} account?"),
    ("At {C}, how are expense reports approved?", "How are expense reports approved at {C}?"),
]
SURFACE_BASE = [
    "What is the return policy for {SKU} in {P}?", "How many open tickets does {C} have?",
    "When is invoice {INV} due?", "Which plan is {C} on?", "Is {F} available on the {C} plan?",
    "What was the revenue of {C} in {Y}?", "Who approved the refund on order {ORD}?",
    "How do I rotate the API key for {C}?", "What is the shipping cost to {P} for {SKU}?",
    "Why did the payment for invoice {INV} fail?",
]
SURFACE_EDITS = [
    lambda s: s.upper(), lambda s: s.lower(), lambda s: "  " + s.replace(" ", "   ") + " ",
    lambda s: s.rstrip("?.") , lambda s: "Hi! " + s, lambda s: "Quick question: " + s,
    lambda s: s + " Thanks!", lambda s: "Hello there, " + s[0].lower() + s[1:],
    lambda s: s.replace("?", "??"), lambda s: "Hey, " + s[0].lower() + s[1:] + " Thank you.",
    lambda s: s + " Thanks in advance.", lambda s: "Good morning. " + s,
]
ROLE_SWAP = [
    ("Did {C} sue {C2} in {Y}?", "Did {C2} sue {C} in {Y}?"),
    ("Does {C} owe {C2} money?", "Does {C2} owe {C} money?"),
    ("Has {C} acquired {C2}?", "Has {C2} acquired {C}?"),
    ("Is {C} a supplier of {C2}?", "Is {C2} a supplier of {C}?"),
    ("Transfer {N} USD from {C} to {C2}.", "Transfer {N} USD from {C2} to {C}."),
    ("Does {PER} report to {PER2}?", "Does {PER2} report to {PER}?"),
    ("Which invoices did {C} send to {C2}?", "Which invoices did {C2} send to {C}?"),
    ("Did {C} outbid {C2} on the {P} contract?", "Did {C2} outbid {C} on the {P} contract?"),
    ("Is {C} a subsidiary of {C2}?", "Is {C2} a subsidiary of {C}?"),
    ("How much did {C} pay {C2} in {Y}?", "How much did {C2} pay {C} in {Y}?"),
    ("Did {PER} replace {PER2} as account manager?", "Did {PER2} replace {PER} as account manager?"),
    ("Can {PER} approve expenses for {PER2}?", "Can {PER2} approve expenses for {PER}?"),
]
ANTONYM = [
    ("Does the {C} plan include {F}?", "Does the {C} plan exclude {F}?"),
    ("Was order {ORD} shipped before {M} {D}?", "Was order {ORD} shipped after {M} {D}?"),
    ("How do I enable {F} for {C}?", "How do I disable {F} for {C}?"),
    ("List the approved invoices of {C}.", "List the rejected invoices of {C}."),
    ("What was the highest price of {SKU} in {Y}?", "What was the lowest price of {SKU} in {Y}?"),
    ("What was the profit of {C} in {Y}?", "What was the loss of {C} in {Y}?"),
    ("Show inbound shipments for {P}.", "Show outbound shipments for {P}."),
    ("Did the revenue of {C} rise in {Y}?", "Did the revenue of {C} fall in {Y}?"),
    ("What is the earliest delivery date for order {ORD}?", "What is the latest delivery date for order {ORD}?"),
    ("How many open tickets does {C} have?", "How many closed tickets does {C} have?"),
    ("Which customers did {C} gain in {Y}?", "Which customers did {C} lose in {Y}?"),
    ("What is the maximum order size for {SKU}?", "What is the minimum order size for {SKU}?"),
    ("Is {SKU} the cheapest model in {P}?", "Is {SKU} the most expensive model in {P}?"),
    ("How do I import contacts into {C}?", "How do I export contacts from {C}?"),
    ("What is the arrival time of shipment {ORD}?", "What is the departure time of shipment {ORD}?"),
    ("Was invoice {INV} paid early?", "Was invoice {INV} paid late?"),
]
UNIT = [
    ("What does shipping a {N} kg parcel to {P} cost?", "What does shipping a {N} lb parcel to {P} cost?"),
    ("Is a {N} GB upload allowed on the {C} plan?", "Is a {N} MB upload allowed on the {C} plan?"),
    ("Can the {C} export job run for {N} minutes?", "Can the {C} export job run for {N} hours?"),
    ("Is delivery free within {N} miles of {P}?", "Is delivery free within {N} km of {P}?"),
    ("Can {PER} approve a refund of ${N}?", "Can {PER} approve a refund of €{N}?"),
    ("Does {C} offer a {N}-day trial?", "Does {C} offer a {N}-week trial?"),
    ("What is the fee for {N} GBP of credit on {C}?", "What is the fee for {N} USD of credit on {C}?"),
    ("Is a latency of {N} ms normal for {C}?", "Is a latency of {N} seconds normal for {C}?"),
    ("How much does {N} litres of fuel cost in {P}?", "How much does {N} gallons of fuel cost in {P}?"),
    ("Will {N} TB of storage be enough for {C}?", "Will {N} GB of storage be enough for {C}?"),
]
BOUND = [
    ("Which customers of {C} have more than {N} seats?", "Which customers of {C} have fewer than {N} seats?"),
    ("List orders over ${N} in {P}.", "List orders under ${N} in {P}."),
    ("Do plans with at least {N} users get a discount at {C}?",
     "Do plans with at most {N} users get a discount at {C}?"),
    ("Which invoices of {C} are above {N} EUR?", "Which invoices of {C} are below {N} EUR?"),
    ("How many tickets took more than {N} hours to close at {C}?",
     "How many tickets took exactly {N} hours to close at {C}?"),
    ("Show accounts with more than {N} failed logins at {C}.",
     "Show accounts with less than {N} failed logins at {C}."),
    ("Is shipping free for orders above {N} USD in {P}?", "Is shipping free for orders up to {N} USD in {P}?"),
    ("Which SKUs sold over {N} units in {Y}?", "Which SKUs sold at least {N} units in {Y}?"),
]
NUMBER_WORDS = [
    ("Does {C} give a discount on {W1} seats?", "Does {C} give a discount on {W2} seats?"),
    ("Can I order {W1} units of {SKU}?", "Can I order {W2} units of {SKU}?"),
    ("Is a team of {W1} people covered by the {C} plan?", "Is a team of {W2} people covered by the {C} plan?"),
    ("What is the fee for {W1} extra users at {C}?", "What is the fee for {W2} extra users at {C}?"),
    ("Did {C} hire {W1} engineers in {Y}?", "Did {C} hire {W2} engineers in {Y}?"),
    ("Ship {W1} pallets to {P}.", "Ship {W2} pallets to {P}."),
]
LANGUAGE = {
    "What is the return policy for {SKU} in {P}?": [
        "Wie lautet die Rückgaberichtlinie für {SKU} in {P}?",
        "Quelle est la politique de retour pour {SKU} à {P} ?",
        "¿Cuál es la política de devolución de {SKU} en {P}?",
        "Qual é a política de devolução do {SKU} em {P}?",
        "Qual è la politica di reso per {SKU} a {P}?",
        "Wat is het retourbeleid voor {SKU} in {P}?"],
    "How many employees does {C} have in {P}?": [
        "Wie viele Mitarbeiter hat {C} in {P}?", "Combien d'employés {C} a-t-il à {P} ?",
        "¿Cuántos empleados tiene {C} en {P}?", "Quantos funcionários a {C} tem em {P}?",
        "Quanti dipendenti ha {C} a {P}?", "Hoeveel werknemers heeft {C} in {P}?"],
    "When is invoice {INV} due?": [
        "Wann ist die Rechnung {INV} fällig?", "Quand la facture {INV} est-elle due ?",
        "¿Cuándo vence la factura {INV}?", "Quando vence a fatura {INV}?",
        "Quando scade la fattura {INV}?", "Wanneer moet factuur {INV} betaald worden?"],
    "Summarise ticket {TCK} for {C}.": [
        "Fasse das Ticket {TCK} für {C} zusammen.", "Résume le ticket {TCK} pour {C}.",
        "Resume el ticket {TCK} para {C}.", "Resuma o ticket {TCK} para a {C}.",
        "Riassumi il ticket {TCK} per {C}.", "Vat ticket {TCK} voor {C} samen."],
    "How do I reset the password of {PER} at {C}?": [
        "Wie setze ich das Passwort von {PER} bei {C} zurück?",
        "Comment réinitialiser le mot de passe de {PER} chez {C} ?",
        "¿Cómo restablezco la contraseña de {PER} en {C}?",
        "Como redefino a senha de {PER} na {C}?",
        "Come reimposto la password di {PER} presso {C}?",
        "Hoe reset ik het wachtwoord van {PER} bij {C}?"],
    "What was the revenue of {C} in {Y}?": [
        "Wie hoch war der Umsatz von {C} im Jahr {Y}?", "Quel était le chiffre d'affaires de {C} en {Y} ?",
        "¿Cuáles fueron los ingresos de {C} en {Y}?", "Qual foi a receita da {C} em {Y}?",
        "Qual è stato il fatturato di {C} nel {Y}?", "Wat was de omzet van {C} in {Y}?"],
}
DOC_LINES = [
    "Net revenue for the quarter came in at ${REV:,}, ahead of plan.",
    "Headcount in the {P} office reached {H} after the spring hiring round.",
    "Churn fell to {R}.{R2}% while gross margin held at {G}%.",
    "The {C} renewal is worth ${B},000 a year and closes in {M}.",
    "Support answered {T:,} tickets with a median first response of {S} minutes.",
    "Cloud spend was ${K:,}, of which storage took {R}{R2}%.",
    "Two enterprise pilots started in {P2}; one converts in {Q}.",
    "Inventory of {SKU} stands at {U:,} units across both warehouses.",
    "Open receivables total ${AR:,} with {R} invoices past due.",
    "The board approved a budget of ${BUD:,} for the data platform.",
]
DOC_ASKS = ["can you summarise the key figures in this report?",
            "please pull out every number in this update and say what it measures.",
            "could you turn this into three bullet points for the board?"]
GREETINGS = ["Hi team,", "Hello,", "Good morning,", "Hey all,", "Dear colleagues,", "Hi there,",
             "Morning everyone,", "Greetings,"]


def _doc(rng: random.Random, s: Slots) -> tuple[list[str], dict]:
    nums = {"REV": rng.randint(200, 990) * 1000 + rng.randint(1, 99) * 10,
            "H": rng.randint(40, 400), "R": rng.randint(1, 9), "R2": rng.randint(1, 9),
            "G": rng.randint(40, 80), "B": rng.randint(20, 90), "T": rng.randint(300, 4000),
            "S": rng.randint(5, 55), "K": rng.randint(10, 90) * 1000 + rng.randint(1, 9) * 100,
            "U": rng.randint(100, 9000), "AR": rng.randint(50, 900) * 1000 + 250,
            "BUD": rng.randint(10, 99) * 10000}
    lines = rng.sample(DOC_LINES, 7)
    return lines, nums


def _render(lines: list[str], nums: dict, s: Slots) -> str:
    return " ".join(line.format(**nums, **s.d) for line in lines)


def doc_pair(rng: random.Random, same: bool) -> tuple[str, str]:
    s = Slots(rng)
    lines, nums = _doc(rng, s)
    ask = rng.choice(DOC_ASKS)
    g1, g2 = rng.sample(GREETINGS, 2)
    body = _render(lines, nums, s)
    if same:
        return f"{g1} {ask}\n\n{body}\n\nThanks, {s.d['PER']}", f"{g2} {ask}\n\n{body}\n\nThanks, {s.d['PER']}"
    # one figure changed deep inside (a line in the second half of the document)
    deep = lines[4:]
    keys = sorted({k for line in deep for k in nums
                   if "{" + k + "}" in line or "{" + k + ":" in line})
    k = rng.choice(keys)
    changed = dict(nums)
    changed[k] = nums[k] + rng.choice([1, 2, 3, 5]) * (1000 if nums[k] > 10000 else 1)
    body2 = " ".join(line.format(**(changed if i >= 4 else nums), **s.d) for i, line in enumerate(lines))
    return f"{g1} {ask}\n\n{body}\n\nThanks, {s.d['PER']}", f"{g1} {ask}\n\n{body2}\n\nThanks, {s.d['PER']}"


def _number_forms(rng: random.Random) -> tuple[str, str, str, str]:
    """(spelled a, spelled b, digits a, digits b) for two different values (either side may be
    written in digits, so "25" vs "twenty-six" is as likely as "twenty-five" vs "thirty")."""
    a, b = rng.sample(sorted(SPELLED), 2)
    return SPELLED[a], SPELLED[b], str(a), str(b)


def gen_kind(kind: str, rng: random.Random, per_kind: int = PER_KIND) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    while len(out) < per_kind:
        s = Slots(rng)
        if kind == "synonym":
            ta, tb = rng.choice(SYNONYM)
            n = rng.choice(sorted(SPELLED))
            s.d.update(SP=SPELLED[n], NUM=str(n))
            pair = (s.fill(ta), s.fill(tb))
        elif kind == "reorder":
            ta, tb = rng.choice(REORDER)
            pair = (s.fill(ta), s.fill(tb)) if rng.random() < 0.5 else (s.fill(tb), s.fill(ta))
        elif kind == "surface":
            base = s.fill(rng.choice(SURFACE_BASE))
            pair = (base, rng.choice(SURFACE_EDITS)(base))
        elif kind == "doc_greeting":
            pair = doc_pair(rng, True)
        elif kind == "doc_figure":
            pair = doc_pair(rng, False)
        elif kind == "role_swap":
            pair = tuple(s.fill(t) for t in rng.choice(ROLE_SWAP))
        elif kind == "antonym":
            ta, tb = rng.choice(ANTONYM)
            pair = (s.fill(ta), s.fill(tb)) if rng.random() < 0.5 else (s.fill(tb), s.fill(ta))
        elif kind == "unit":
            ta, tb = rng.choice(UNIT)
            pair = (s.fill(ta), s.fill(tb)) if rng.random() < 0.5 else (s.fill(tb), s.fill(ta))
        elif kind == "bound":
            ta, tb = rng.choice(BOUND)
            pair = (s.fill(ta), s.fill(tb)) if rng.random() < 0.5 else (s.fill(tb), s.fill(ta))
        elif kind == "number_words":
            ta, tb = rng.choice(NUMBER_WORDS)
            wa, wb, da, db = _number_forms(rng)
            form = rng.random()  # words / words, words / digits, digits / words
            w1, w2 = (wa, wb) if form < 0.5 else (wa, db) if form < 0.75 else (da, wb)
            s.d.update(W1=w1, W2=w2)
            pair = (s.fill(ta), s.fill(tb))
        elif kind == "language":
            en = rng.choice(sorted(LANGUAGE))
            other = rng.choice(LANGUAGE[en])
            pair = (s.fill(en), s.fill(other)) if rng.random() < 0.5 else (s.fill(other), s.fill(en))
        elif kind == "code_language":
            l1, l2 = rng.sample(LANGS, 2)
            task = rng.choice(TASKS)
            frame = rng.choice(["Write a {L} function that {T}.", "Show me {L} code that {T}.",
                                "In {L}, write a function that {T}.", "Implement in {L} a function that {T}."])
            pair = (frame.format(L=l1, T=task), frame.format(L=l2, T=task))
        elif kind == "code_order":
            lang = rng.choice(LANGS)
            x, y = rng.choice(STEPS)
            frame = rng.choice(["Write a {L} function that {X} and then {Y}.",
                                "In {L}, write code that first {X}, then {Y}.",
                                "Give me a {L} snippet that {X} and afterwards {Y}."])
            y2 = y.replace(" it", " the input") if y.endswith(" it") or " it " in y else y
            pair = (frame.format(L=lang, X=x, Y=y2), frame.format(L=lang, X=y2, Y=x))
        else:
            raise ValueError(kind)
        if pair[0] != pair[1] and pair not in seen:
            seen.add(pair)
            out.append(pair)
    return out


KINDS = {"synonym": True, "reorder": True, "surface": True, "doc_greeting": True,
         "role_swap": False, "antonym": False, "unit": False, "bound": False,
         "number_words": False, "doc_figure": False, "language": False,
         "code_language": False, "code_order": False}


def build(seed: int = SEED, per_kind: int = PER_KIND) -> list[dict]:
    """The pairs; another ``seed`` gives other values in the same templates (the quality
    bench's calibration traffic)."""
    rows = []
    for i, (kind, same) in enumerate(KINDS.items()):
        rng = random.Random(seed * 100 + i)
        rows += [{"a": a, "b": b, "same": same, "kind": kind}
                 for a, b in gen_kind(kind, rng, per_kind)]
    return rows


def main() -> None:
    rows = build()
    with OUT.open("w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} pairs to {OUT}")


if __name__ == "__main__":
    main()
