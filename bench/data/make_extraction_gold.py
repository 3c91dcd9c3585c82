"""Writes bench/data/extraction_gold.jsonl: small single-field extraction items with gold answers.

Hand-written sentence templates (below) filled from hand-written value lists with a fixed
seed, so the file is reproducible. Items range from direct ("The invoice number is X.")
to ones with distractors (a replaced invoice, a previous amount, two cities), which is
where a small model goes wrong. Each line: {"id", "field", "text", "gold", "kind"} where
kind is "text" (compared case- and punctuation-insensitively) or "number".

    .venv/bin/python bench/data/make_extraction_gold.py
"""
from __future__ import annotations

import json
import random
from pathlib import Path

CITIES = ["Lyon", "Porto", "Graz", "Utrecht", "Leeds", "Bilbao", "Turku", "Brno", "Gdansk",
          "Aarhus", "Bologna", "Ghent", "Cork", "Malmo", "Basel", "Nantes", "Seville", "Split"]
PEOPLE = ["Maria Keller", "Tom Okafor", "Ana Silva", "Jonas Berg", "Priya Nair", "Luca Romano",
          "Eva Novak", "Sam Carter", "Ines Duarte", "Omar Haddad", "Lena Fischer", "Yuki Tanaka"]
COMPANIES = ["Acme GmbH", "Northwind Ltd", "Bluepeak SA", "Orbital Foods", "Kestrel Labs",
             "Harbor Freight Co", "Vela Systems", "Tamarind BV", "Quill & Sons", "Redwood AG"]
PRODUCTS = ["desk lamp", "espresso machine", "office chair", "USB hub", "standing desk",
            "laser printer", "webcam", "monitor arm", "paper shredder", "label maker"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]

# (field, kind, [templates]); {v} is the gold value, other slots are distractors/filler.
TEMPLATES = [
    ("invoice number", "text", [
        "The invoice number is {v}.",
        "Please pay invoice {v} by the end of the month.",
        "Ref: {v} — services rendered in {city}.",
        "Invoice {v} replaces the cancelled invoice {d_inv}.",
        "Our records show {d_inv} was paid; the open one is {v}.",
        "From {company}: attached is invoice {v} for {amount} EUR.",
    ]),
    ("city", "text", [
        "The shipment leaves from {v}.",
        "{person} moved to {v} last spring.",
        "Meeting venue: {company} offices, {v}.",
        "The flight from {d_city} lands in {v} at noon.",
        "We closed the {d_city} branch and opened one in {v}.",
        "Deliver to: {person}, 12 Harbour Road, {v}.",
    ]),
    ("amount", "number", [
        "Total due: {v} EUR.",
        "The invoice amounts to {v} euros.",
        "Please transfer {v} EUR to {company}.",
        "The original quote was {d_amount} EUR but the final amount is {v} EUR.",
        "After a discount of {d_small} EUR, you owe {v} EUR.",
        "{person} paid {v} EUR for the {product}.",
    ]),
    ("person", "text", [
        "The contract was signed by {v}.",
        "Contact person: {v} ({company}).",
        "{v} will present the report on Monday.",
        "{d_person} handed the project over to {v}.",
        "Please cc {v}, not {d_person}.",
        "Approved by {v} on behalf of {company}.",
    ]),
    ("company", "text", [
        "The supplier is {v}.",
        "{person} works for {v}.",
        "Invoice from {v}, due in 30 days.",
        "{d_company} was acquired by {v} in 2021.",
        "We switched our cloud provider from {d_company} to {v}.",
        "Billing entity: {v}, {city}.",
    ]),
    ("order id", "text", [
        "Your order {v} has shipped.",
        "Order ID: {v}.",
        "Regarding order {v}, the {product} is back-ordered.",
        "Order {d_order} was merged into order {v}.",
        "Please cancel {d_order} and keep {v}.",
        "Tracking for order {v}: out for delivery in {city}.",
    ]),
    ("quantity", "number", [
        "We need {v} units of the {product}.",
        "Quantity ordered: {v}.",
        "Please ship {v} boxes to {city}.",
        "The order was raised from {d_small} to {v} units.",
        "{person} requested {v} more {product}s.",
    ]),
    ("month", "text", [
        "The conference takes place in {v}.",
        "Payment is due in {v}.",
        "{person} starts the new role in {v}.",
        "The launch moved from {d_month} to {v}.",
        "Report period: {v} {year}.",
    ]),
    ("email", "text", [
        "Write to {v} for support.",
        "Contact: {person} <{v}>.",
        "Send the invoice to {v}, not to {d_email}.",
        "Reply-to address: {v}.",
    ]),
    ("product", "text", [
        "The customer returned the {v}.",
        "Item: {v}, quantity {small}.",
        "{person} ordered a {v} from {company}.",
        "We replaced the broken {d_product} with a new {v}.",
    ]),
]


def _values(field: str, rng: random.Random) -> str:
    if field == "invoice number":
        return f"INV-{rng.randint(1000, 99999)}"
    if field == "city":
        return rng.choice(CITIES)
    if field == "amount":
        return f"{rng.randint(10, 9999)}.{rng.randint(0, 99):02d}" if rng.random() < 0.6 \
            else str(rng.randint(10, 20000))
    if field == "person":
        return rng.choice(PEOPLE)
    if field == "company":
        return rng.choice(COMPANIES)
    if field == "order id":
        return f"{rng.choice(['ORD', 'SO', 'PO'])}-{rng.randint(10000, 999999)}"
    if field == "quantity":
        return str(rng.randint(2, 500))
    if field == "month":
        return rng.choice(MONTHS)
    if field == "email":
        first = rng.choice(PEOPLE).split()[0].lower()
        return f"{first}@{rng.choice(['example.com', 'mail.test', 'corp.example'])}"
    if field == "product":
        return rng.choice(PRODUCTS)
    raise AssertionError(field)


def _other(field: str, value: str, rng: random.Random) -> str:
    while True:
        d = _values(field, rng)
        if d != value:
            return d


def build(seed: int = 8) -> list[dict]:
    rng = random.Random(seed)
    items = []
    for field, kind, templates in TEMPLATES:
        for template in templates:
            for _ in range(4):
                v = _values(field, rng)
                slots = {"v": v, "city": rng.choice(CITIES), "company": rng.choice(COMPANIES),
                         "person": rng.choice(PEOPLE), "product": rng.choice(PRODUCTS),
                         "amount": _values("amount", rng), "small": str(rng.randint(2, 40)),
                         "year": str(rng.randint(2019, 2026)),
                         "d_inv": _other("invoice number", v, rng),
                         "d_city": _other("city", v, rng),
                         "d_amount": _other("amount", v, rng),
                         "d_small": str(rng.randint(5, 90)),
                         "d_person": _other("person", v, rng),
                         "d_company": _other("company", v, rng),
                         "d_order": _other("order id", v, rng),
                         "d_month": _other("month", v, rng),
                         "d_email": _other("email", v, rng),
                         "d_product": _other("product", v, rng)}
                items.append({"id": f"x{len(items):03d}", "field": field,
                              "text": template.format(**slots), "gold": v, "kind": kind})
    return items


def main() -> None:
    out = Path(__file__).with_name("extraction_gold.jsonl")
    items = build()
    with out.open("w") as f:
        for it in items:
            f.write(json.dumps(it) + "\n")
    print(f"wrote {len(items)} items to {out}")


if __name__ == "__main__":
    main()
