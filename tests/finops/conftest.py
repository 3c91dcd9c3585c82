"""A generated month of ledger traffic with a mid-month frontier price change."""
from __future__ import annotations

import pytest
import sqlalchemy as sa

from app.extensions import db
from app.finops import simulate
from app.ledger.models import LedgerEntry
from app.workflows.models import Workflow
from tests.factories import TenantFactory

PERIOD = "2026-10"


def seed_catalog(price_change_at):
    tiers = simulate.default_tiers(price_change_at)
    simulate.add_catalog(tiers)
    db.session.commit()
    return tiers


def seed_workflows(tenants):
    out = []
    for t in tenants:
        for cat in simulate.COHORTS:
            sig = f"{t.id:04d}{cat}"[:64]
            db.session.add(Workflow(tenant_id=t.id, signature=sig, name=cat, category=cat))
            out.append(simulate.SimWorkflow(t.id, sig, cat))
    db.session.commit()
    return out


def insert_rows(rows, chunk=2000):
    rows = list(rows)
    for i in range(0, len(rows), chunk):
        db.session.execute(sa.insert(LedgerEntry), rows[i:i + chunk])
    db.session.commit()
    return rows


def gateway_pricer():
    """The gateway's booking function (``app.core.pricing.book_cost``, what
    ``app.gateway.telemetry.finish`` calls) over the config snapshot built from SQL: tier
    prices with their effective-dated changes, as a gateway holds them."""
    from app.core.pricing import book_cost
    from app.contract.snapshot import Snapshot
    from app.snapshot.service import build_snapshot
    snap = Snapshot(build_snapshot())

    def price(tier, at, prompt, cached, completion, raw):
        served = snap.tiers_by_name[tier.name] if tier is not None else None
        return book_cost(snap.all_tiers, served, at, prompt, cached, completion, raw)
    return price


def book_through_ledger(rows, chunk=500):
    """Put ``rows`` on the ledger stream as gateway events (``finish``'s shape, batched
    like the gateway's ledger writer) and drain them into SQL with the ledger worker's
    ``drain_stream``. Returns the events."""
    import orjson

    from app.ledger.service import drain_stream
    from app.redis_client import get_redis, keys
    drain_stream(max_batches=100)  # anything other tests left on the shared stream ...
    db.session.execute(sa.delete(LedgerEntry))  # ... is not this month's traffic
    db.session.commit()
    events = [{**r, **{k: f"{v:f}" for k, v in r.items() if k.endswith("_usd")},
               "at": r["at"].isoformat()} for r in rows]
    r, stream = get_redis(), keys().ledger_stream()
    for i in range(0, len(events), chunk):
        r.xadd(stream, {"b": orjson.dumps(events[i:i + chunk])})
    drain_stream(max_batches=100)
    return events


@pytest.fixture()
def month(app):
    """Two tenants (departments), three tiers, 3000 requests in October 2026, frontier
    price cut on the 15th at noon (a TierPrice row). Every request is priced by the
    gateway's booking function from the config snapshot and reaches SQL through the
    ledger stream and its drain."""
    change = simulate.mid_month(PERIOD)
    tiers = seed_catalog(change)
    tenants = [TenantFactory(name="revops", department="Revenue Ops"),
               TenantFactory(name="legal", department="Legal")]
    wfs = seed_workflows(tenants)
    rows = list(simulate.generate_month(PERIOD, wfs, tiers, 3000, seed=11,
                                        price=gateway_pricer()))
    book_through_ledger(rows)
    return {"period": PERIOD, "tiers": tiers, "tenants": tenants, "rows": rows,
            "change": change}


def login(client, user, password=None):
    import re

    from tests.factories import PASSWORD
    page = client.get("/login").get_data(as_text=True)
    token = re.search(r'name="csrf_token" type="hidden" value="([^"]+)"', page) or \
        re.search(r'name="csrf_token" value="([^"]+)"', page)
    resp = client.post("/login", data={"email": user.email, "password": password or PASSWORD,
                                       "csrf_token": token.group(1)})
    assert resp.status_code == 302, resp.get_data(as_text=True)[:500]
    return client


def csrf_of(html: str) -> str:
    import re
    return re.search(r'name="csrf_token" value="([^"]+)"', html).group(1)


def api_token(user) -> str:
    from app.auth.service import create_admin_token
    _, plaintext = create_admin_token(user, "t")
    return plaintext
