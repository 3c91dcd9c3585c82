"""A month of traffic for bench/replay.py: workflows of the seed's five categories with
gold answers and validators, multi-turn sessions, repeats and paraphrases, bursts and
several tenants. Deterministic for a seed; sized by ``n`` (requests in the month).

The generator is the bench's own and is not tuned to the result: the repeat rates are
fixed here (``REPEATS``) from what production assistants report (FAQ-style support
traffic repeats most, per-document extraction least), and stated in the bench output.

A request is a dict: ``id`` (stable, the gold key), ``tenant``, ``workflow``, ``category``,
``at`` (seconds into the month), ``session`` (None or an id), ``turn``, ``system``,
``user`` (this turn's text), ``history`` (earlier (user, gold) turns of the session; the
replay substitutes the answers it was served), ``response_format`` (or None),
``max_tokens``, ``gold`` (the reference answer: a dict for JSON workflows, else text) and
``check`` (what the validator compares: a label, a fact, a SQL result).
"""
from __future__ import annotations

import json
import random
import re
import sqlite3
from dataclasses import dataclass, field
from typing import Any

MONTH_DAYS = 30
DAY = 86400.0

# (category) -> (exact repeat share, paraphrase share) of that category's first turns
REPEATS = {"extraction": (0.02, 0.0), "support": (0.30, 0.15), "classification": (0.04, 0.0),
           "code": (0.10, 0.10), "long_context": (0.12, 0.08)}
FOLLOW_UP = (0.30, 0.10)   # support conversations with a 2nd turn, and with a 3rd
MAX_TOKENS = {"extraction": 64, "support": 40, "classification": 4, "code": 40,
              "long_context": 12}


@dataclass(frozen=True)
class TenantSpec:
    name: str
    department: str
    weight: float
    mix: dict[str, float]
    burst: str                      # the category its batch jobs send
    bursts: int = 3


TENANTS = (
    TenantSpec("northwind-retail", "Retail", 0.45,
               {"support": 0.40, "classification": 0.30, "extraction": 0.20, "code": 0.10},
               "classification"),
    TenantSpec("kestrel-finance", "Finance", 0.35,
               {"extraction": 0.55, "long_context": 0.25, "code": 0.20}, "extraction"),
    TenantSpec("vela-legal", "Legal", 0.20,
               {"long_context": 0.60, "classification": 0.20, "support": 0.20}, "long_context"),
)
WORKFLOWS = {"extraction": "invoice-extraction", "support": "support-answers",
             "classification": "ticket-triage", "code": "sql-analytics",
             "long_context": "contract-qa"}

COMPANIES = ["Northwind GmbH", "Bluepeak SA", "Kestrel Labs", "Vela Systems", "Tamarind BV",
             "Acme Industrial", "Lyon Textiles", "Porto Logistics", "Graz Components",
             "Oakridge Foods", "Harbor Metals", "Sable Pharma"]
PEOPLE = ["Maria Keller", "Tom Okafor", "Priya Nair", "Jonas Berg", "Ana Ruiz", "Li Wei",
          "Sam Carter", "Eva Novak", "Omar Haddad", "Hana Sato"]
CURRENCIES = ["EUR", "USD", "GBP", "CHF"]

# --- extraction ------------------------------------------------------------------------
EXTRACT_SYSTEM = ("You are the accounts-payable extraction service. Read the invoice and "
                  "answer with a JSON object matching the schema, nothing else.")
EXTRACT_KEYS = ("supplier_invoice_reference_number", "supplier_legal_entity_name",
                "invoice_issue_date", "total_amount_due", "currency_code")
EXTRACT_SCHEMA = {"type": "json_schema", "json_schema": {"name": "invoice", "strict": True,
                  "schema": {"type": "object", "additionalProperties": False,
                             "required": list(EXTRACT_KEYS), "properties": {
                                 "supplier_invoice_reference_number": {"type": "string"},
                                 "supplier_legal_entity_name": {"type": "string"},
                                 "invoice_issue_date": {"type": "string"},
                                 "total_amount_due": {"type": "number"},
                                 "currency_code": {"type": "string"}}}}}


def _invoice(rng: random.Random) -> tuple[str, dict]:
    gold = {"supplier_invoice_reference_number": f"INV-{rng.randint(10000, 99999)}",
            "supplier_legal_entity_name": rng.choice(COMPANIES),
            "invoice_issue_date": f"2026-{rng.randint(1, 11):02d}-{rng.randint(1, 28):02d}",
            "total_amount_due": round(rng.uniform(20, 20000), 2),
            "currency_code": rng.choice(CURRENCIES)}
    lines = [f"  {rng.randint(1, 40)} x {rng.choice(['steel bracket', 'valve', 'pallet', 'hinge', 'sensor'])}"
             for _ in range(rng.randint(1, 4))]
    text = (f"INVOICE {gold['supplier_invoice_reference_number']}\nFrom: "
            f"{gold['supplier_legal_entity_name']}, {rng.randint(1, 200)} Market Street\n"
            f"Date of issue: {gold['invoice_issue_date']}\nBill to: "
            f"{rng.choice(COMPANIES)}\nItems:\n" + "\n".join(lines) +
            f"\nTotal due: {gold['total_amount_due']:.2f} {gold['currency_code']}\n"
            f"Payment within {rng.choice([14, 30, 45])} days.")
    return text, gold


# --- support ---------------------------------------------------------------------------
SUPPORT_SYSTEM = ("You are the customer support assistant of an online store. Answer in one "
                  "or two sentences and name the exact menu path.")
# intent -> (question phrasings, gold answer, fact checked, follow-up question, its answer,
# its fact)
INTENTS = {
    "reset_password": (["How do I reset my password?", "I forgot my password, what now?",
                        "Where can I change my login password?"],
                       "Go to Settings > Security > Reset password; we email you a link.",
                       "Settings > Security > Reset password",
                       "And on the mobile app?", "In the app, open Profile > Security.",
                       "Profile > Security"),
    "export_invoices": (["How can I download all my invoices?", "Where do I export my invoices?",
                         "Can I get my invoices as a file?"],
                        "Open Billing > Invoices > Export and pick CSV or PDF.",
                        "Billing > Invoices > Export",
                        "Can I schedule that monthly?", "Yes: Billing > Invoices > Schedule.",
                        "Billing > Invoices > Schedule"),
    "cancel_order": (["How do I cancel an order?", "I want to cancel my order.",
                      "Is it possible to cancel an order I just placed?"],
                     "Go to Orders > Your order > Cancel within 24 hours of ordering.",
                     "Orders > Your order > Cancel",
                     "What if it already shipped?", "Then use Orders > Your order > Return.",
                     "Orders > Your order > Return"),
    "change_address": (["How do I change my delivery address?", "I moved, how do I update my address?",
                        "Where can I edit the shipping address?"],
                       "Use Account > Addresses > Edit, then set it as default.",
                       "Account > Addresses > Edit",
                       "Does that change open orders too?", "No: edit each under Orders > Change address.",
                       "Orders > Change address"),
    "two_factor": (["How do I turn on two-factor authentication?", "Can I enable 2FA?",
                    "Where is the two-step login setting?"],
                   "Enable it under Settings > Security > Two-factor and scan the QR code.",
                   "Settings > Security > Two-factor",
                   "I lost my phone, how do I get in?", "Use a recovery code at Login > Recovery.",
                   "Login > Recovery"),
    "refund_status": (["Where is my refund?", "How do I check the status of my refund?",
                       "My refund has not arrived yet, where can I see it?"],
                      "Check Orders > Returns > Refund status; refunds take 5 business days.",
                      "Orders > Returns > Refund status",
                      "Can it go to a different card?", "No; contact us via Help > Contact.",
                      "Help > Contact"),
    "gift_card": (["How do I redeem a gift card?", "Where do I enter my gift card code?",
                   "Can I pay with a gift card?"],
                  "Enter the code at Checkout > Payment > Gift card.",
                  "Checkout > Payment > Gift card",
                  "Can I check the balance?", "Yes, under Account > Gift cards.",
                  "Account > Gift cards"),
    "newsletter": (["How do I unsubscribe from emails?", "Stop sending me newsletters.",
                    "Where can I turn off marketing emails?"],
                   "Turn them off in Account > Notifications > Email.",
                   "Account > Notifications > Email",
                   "And the SMS messages?", "Those are under Account > Notifications > SMS.",
                   "Account > Notifications > SMS"),
}

# --- classification --------------------------------------------------------------------
TRIAGE_SYSTEM = ("Classify the support ticket into exactly one of: billing, shipping, "
                 "account, technical. Reply with the label only.")
TICKETS = {
    "billing": ["I was charged twice for order {n}.", "The invoice {n} shows the wrong VAT amount.",
                "Why did my card get a payment of {a} EUR I do not recognise?",
                "Please refund the duplicate payment on invoice {n}."],
    "shipping": ["My parcel {n} has not arrived after two weeks.",
                 "The courier left package {n} at the wrong address.",
                 "Tracking for shipment {n} has not moved since Monday.",
                 "Delivery {n} arrived damaged, the box was crushed."],
    "account": ["I cannot log in to my account since yesterday, user {p}.",
                "Please delete my account and personal data, {p}.",
                "How do I change the email address on my account? {p}",
                "My account {p} was locked after too many attempts."],
    "technical": ["The checkout page shows error 500 when I pay for order {n}.",
                  "Your app crashes on startup after the last update, build {n}.",
                  "The website does not load images on Safari, session {n}.",
                  "Search returns no results for any query since {n}."],
}

# --- code ------------------------------------------------------------------------------
SQL_SYSTEM = ("You write SQLite queries. Tables: customers(id, name, country), "
              "orders(id, customer_id, amount, status, year). Answer with one SQL query only.")
# (phrasings with {c}/{y}/{s}, gold SQL)
SQL_TASKS = [
    (["How many orders did customer {c} place?", "Count the orders of customer id {c}."],
     "SELECT COUNT(*) FROM orders WHERE customer_id = {c}"),
    (["What is the total amount of orders in {y}?", "Sum the order amounts for the year {y}."],
     "SELECT SUM(amount) FROM orders WHERE year = {y}"),
    (["List the ids of orders with status '{s}'.", "Which order ids have status {s}?"],
     "SELECT id FROM orders WHERE status = '{s}'"),
    (["How many customers are in {k}?", "Count customers whose country is {k}."],
     "SELECT COUNT(*) FROM customers WHERE country = '{k}'"),
    (["What is the largest order amount of customer {c}?",
      "Give the maximum amount among orders of customer {c}."],
     "SELECT MAX(amount) FROM orders WHERE customer_id = {c}"),
    (["Total order amount per customer in {y}, as customer_id and total.",
      "For {y}, sum amount by customer_id."],
     "SELECT customer_id, SUM(amount) FROM orders WHERE year = {y} GROUP BY customer_id"),
]
STATUSES = ["open", "shipped", "cancelled", "returned"]
COUNTRIES = ["DE", "FR", "PT", "AT", "NL", "ES"]

# --- long context ----------------------------------------------------------------------
CONTRACT_SYSTEM = ("You answer questions about the contract below. Answer with the exact "
                   "value from the contract, nothing else.")
CLAUSES = {  # question phrasings, value pool
    "notice": (["What is the termination notice period?", "How much notice is needed to terminate?"],
               ["30 days", "60 days", "90 days", "120 days"]),
    "cap": (["What is the liability cap?", "Up to what amount is liability limited?"],
            ["EUR 250,000", "EUR 1,000,000", "USD 500,000", "twice the annual fees"]),
    "law": (["Which law governs the agreement?", "What is the governing law?"],
            ["the laws of Austria", "the laws of England", "the laws of Portugal",
             "the laws of the Netherlands"]),
    "payment": (["What are the payment terms?", "Within how many days must invoices be paid?"],
                ["net 30", "net 45", "net 60", "net 15"]),
    "renewal": (["How long is each renewal term?", "For how long does the contract renew?"],
                ["12 months", "24 months", "36 months", "6 months"]),
}
FILLER = ["The parties shall cooperate in good faith in performing this agreement.",
          "Each party shall keep the other party's confidential information secret.",
          "Notices shall be in writing and delivered to the addresses stated above.",
          "Neither party may assign this agreement without prior written consent.",
          "The supplier shall maintain adequate insurance throughout the term.",
          "Force majeure events suspend the affected obligations for their duration.",
          "Amendments are valid only if signed by authorised representatives of both parties.",
          "Personal data shall be processed in accordance with applicable data protection law.",
          "The customer shall provide timely access to the information the supplier requires.",
          "Service levels are measured monthly and reported within ten business days."]
CLAUSE_TEXT = {"notice": "Either party may terminate this agreement with {v} written notice.",
               "cap": "The total liability of each party is limited to {v}.",
               "law": "This agreement is governed by {v}.",
               "payment": "Invoices are payable {v} from the invoice date.",
               "renewal": "The agreement renews automatically for successive terms of {v}."}


def _contract(rng: random.Random, name: str) -> tuple[str, dict]:
    values = {k: rng.choice(v[1]) for k, v in CLAUSES.items()}
    parts = [f"MASTER SERVICES AGREEMENT between {name} and {rng.choice(COMPANIES)}."]
    keys = list(CLAUSES)
    for i in range(1, 46):
        if i % 9 == 0 and keys:
            k = keys.pop(0)
            parts.append(f"{i}. " + CLAUSE_TEXT[k].format(v=values[k]))
        else:
            parts.append(f"{i}. " + rng.choice(FILLER))
    return "\n".join(parts), values


# --- the month -------------------------------------------------------------------------
@dataclass
class Month:
    requests: list[dict]
    tenants: tuple[TenantSpec, ...] = TENANTS
    stats: dict[str, Any] = field(default_factory=dict)


def _arrival(rng: random.Random) -> float:
    """Seconds into the month: weekdays busier than weekends, business hours busiest."""
    while True:
        day = rng.randrange(MONTH_DAYS)
        weekend = (day + 6) % 7 >= 5          # 2026-11-01 is a Sunday
        if rng.random() < (0.35 if weekend else 1.0):
            break
    hour = rng.choices(range(24), weights=[1, 1, 1, 1, 1, 2, 3, 6, 9, 10, 10, 9, 8, 9, 10,
                                           10, 9, 7, 5, 4, 3, 2, 2, 1])[0]
    return day * DAY + hour * 3600 + rng.random() * 3600


def generate(n: int, seed: int = 0) -> Month:
    """About ``n`` requests (turns) over the month, time-ordered."""
    rng = random.Random(seed)
    docs = {t.name: [_contract(rng, t.name) for _ in range(6)] for t in TENANTS}
    out: list[dict] = []
    seen: dict[tuple[str, str], list[dict]] = {}   # (tenant, category) -> first turns so far
    counts = {"exact": 0, "paraphrase": 0, "new": 0, "follow_up": 0, "burst": 0}

    def first_turn(t: TenantSpec, cat: str, at: float) -> list[dict]:
        prior = seen.setdefault((t.name, cat), [])
        exact, para = REPEATS[cat]
        u = rng.random()
        if prior and u < exact:
            base = rng.choice(prior)
            counts["exact"] += 1
            return [{**base, "at": at, "session": None, "repeat": "exact"}]
        if prior and u < exact + para and base_paraphrasable(cat):
            base = rng.choice([p for p in prior if p.get("para")] or prior)
            if base.get("para"):
                counts["paraphrase"] += 1
                return [{**base, "user": rng.choice(base["para"]), "at": at, "session": None,
                         "repeat": "paraphrase"}]
        counts["new"] += 1
        turns = make_new(t, cat, at)
        prior.append(turns[0])
        return turns

    def base_paraphrasable(cat: str) -> bool:
        return REPEATS[cat][1] > 0

    def make_new(t: TenantSpec, cat: str, at: float) -> list[dict]:
        req = {"tenant": t.name, "workflow": WORKFLOWS[cat], "category": cat, "at": at,
               "session": None, "turn": 1, "history": [], "response_format": None,
               "max_tokens": MAX_TOKENS[cat], "repeat": "new", "para": []}
        if cat == "extraction":
            text, gold = _invoice(rng)
            req.update(system=EXTRACT_SYSTEM, user=text, gold=gold, check=gold,
                       response_format=EXTRACT_SCHEMA)
        elif cat == "support":
            intent = rng.choice(list(INTENTS))
            qs, ans, fact, fq, fans, ffact = INTENTS[intent]
            q = rng.choice(qs)
            canned = rng.random() < 0.5   # half come from the help widget (no personal detail)
            user = q if canned else f"{q} My order is {rng.randint(100000, 999999)}, " \
                                    f"name {rng.choice(PEOPLE)}."
            req.update(system=SUPPORT_SYSTEM, user=user, gold=ans, check=fact,
                       para=[p for p in qs if p != q] if canned else [])
            turns = [req]
            k = 1 + (rng.random() < FOLLOW_UP[0]) + (rng.random() < FOLLOW_UP[1])
            if k > 1:
                sid = f"s{rng.getrandbits(40):x}"
                req["session"] = sid
                nxt = {**req, "turn": 2, "user": fq, "gold": fans, "check": ffact,
                       "at": at + rng.uniform(20, 120), "para": []}
                turns.append(nxt)
                if k > 2:
                    turns.append({**nxt, "turn": 3, "user": "Thanks. Is there anything else I need to do?",
                                  "gold": f"No, that is all. (See {ffact}.)", "check": ffact,
                                  "at": nxt["at"] + rng.uniform(20, 120)})
                counts["follow_up"] += k - 1
            return turns
        elif cat == "classification":
            label = rng.choice(list(TICKETS))
            text = rng.choice(TICKETS[label]).format(n=rng.randint(10000, 99999),
                                                     a=rng.randint(5, 900), p=rng.choice(PEOPLE))
            req.update(system=TRIAGE_SYSTEM, user=text, gold=label, check=label)
        elif cat == "code":
            phr, sql = rng.choice(SQL_TASKS)
            args = {"c": rng.randint(1, 12), "y": rng.choice([2024, 2025, 2026]),
                    "s": rng.choice(STATUSES), "k": rng.choice(COUNTRIES)}
            texts = [p.format(**args) for p in phr]
            q = rng.choice(texts)
            gold_sql = sql.format(**args)
            req.update(system=SQL_SYSTEM, user=q, gold=gold_sql, check=gold_sql,
                       para=[p for p in texts if p != q])
        else:
            doc, values = rng.choice(docs[t.name])
            clause = rng.choice(list(CLAUSES))
            qs = CLAUSES[clause][0]
            q = rng.choice(qs)
            req.update(system=CONTRACT_SYSTEM + "\n\n" + doc, user=q, gold=values[clause],
                       check=values[clause], para=[p for p in qs if p != q])
        return [req]

    for t in TENANTS:
        n_t = max(1, round(n * t.weight))
        burst_n = min(n_t // 4, t.bursts * max(4, n_t // 20))
        cats, weights = zip(*t.mix.items())
        made = 0
        for b in range(t.bursts):     # batch jobs: one category, minutes apart
            start = _arrival(rng)
            for i in range(burst_n // t.bursts):
                turns = first_turn(t, t.burst, start + i * rng.uniform(2, 12))
                counts["burst"] += 1
                out.extend(turns)
                made += len(turns)
        while made < n_t:
            cat = rng.choices(cats, weights=weights)[0]
            turns = first_turn(t, cat, _arrival(rng))
            out.extend(turns)
            made += len(turns)
    out.sort(key=lambda r: r["at"])
    for i, r in enumerate(out):
        r["id"] = f"q{seed}-{i:06d}"
    return Month(out, stats={**counts, "requests": len(out)})


# --- validators ------------------------------------------------------------------------
def _norm(s: str) -> str:
    return re.sub(r"\s+", " ", str(s)).strip().casefold()


def _json_of(text: str) -> Any:
    m = re.search(r"\{.*\}", text, re.S)
    if not m:
        return None
    try:
        return json.loads(m.group(0))
    except ValueError:
        return None


_DB: sqlite3.Connection | None = None


def _sql_db() -> sqlite3.Connection:
    global _DB
    if _DB is None:
        rng = random.Random(12345)
        db = sqlite3.connect(":memory:", check_same_thread=False)
        db.execute("CREATE TABLE customers(id INTEGER PRIMARY KEY, name TEXT, country TEXT)")
        db.execute("CREATE TABLE orders(id INTEGER PRIMARY KEY, customer_id INTEGER, "
                   "amount REAL, status TEXT, year INTEGER)")
        for i in range(1, 13):
            db.execute("INSERT INTO customers VALUES (?, ?, ?)",
                       (i, rng.choice(PEOPLE), rng.choice(COUNTRIES)))
        for i in range(1, 201):
            db.execute("INSERT INTO orders VALUES (?, ?, ?, ?, ?)",
                       (i, rng.randint(1, 12), round(rng.uniform(5, 900), 2),
                        rng.choice(STATUSES), rng.choice([2024, 2025, 2026])))
        _DB = db
    return _DB


def _rows(sql: str):
    sql = re.sub(r"^```\w*|```$", "", sql.strip(), flags=re.M).strip()
    m = re.search(r"(select\b.*?)(;|$)", sql, re.I | re.S)
    if not m:
        return None
    try:
        return sorted(map(repr, _sql_db().execute(m.group(1)).fetchall()))
    except sqlite3.Error:
        return None


def validate(req: dict, answer: str) -> bool:
    """The workflow's validator: does ``answer`` meet the bar the gold answer sets?"""
    cat = req["category"]
    if cat == "extraction":
        got = _json_of(answer)
        if not isinstance(got, dict):
            return False
        for k, v in req["check"].items():
            g = got.get(k)
            if isinstance(v, float):
                try:
                    if abs(float(g) - v) > 0.005:
                        return False
                except (TypeError, ValueError):
                    return False
            elif _norm(g) != _norm(v):
                return False
        return True
    if cat == "classification":
        words = re.findall(r"[a-z]+", answer.casefold())
        return bool(words) and words[0] == req["check"]
    if cat == "code":
        got = _rows(answer)
        return got is not None and got == _rows(req["check"])
    return _norm(req["check"]) in _norm(answer)


def frontier_answer(req: dict) -> str:
    """What the gold frontier says (the client's own keys; the server maps them)."""
    g = req["gold"]
    return json.dumps(g, separators=(",", ":")) if isinstance(g, dict) else str(g)
