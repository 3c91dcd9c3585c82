"""A generated month of ledger traffic with a mid-month frontier price change."""
from __future__ import annotations

import pytest
import sqlalchemy as sa

from app.catalog.models import Tier
from app.extensions import db
from app.finops import simulate
from app.finops.models import TierPrice
from app.ledger.models import LedgerEntry
from app.workflows.models import Workflow
from tests.factories import TenantFactory

PERIOD = "2026-10"


def seed_catalog(price_change_at):
    tiers = simulate.default_tiers(price_change_at)
    for rank, t in enumerate(tiers, start=1):
        base = t.schedule[0]
        row = Tier(name=t.name, rank=rank, model=t.model, upstream_kind="external",
                   price_input_per_m=base.input_per_m,
                   price_cached_input_per_m=base.cached_input_per_m,
                   price_output_per_m=base.output_per_m)
        db.session.add(row)
        db.session.flush()
        for p in t.schedule[1:]:
            db.session.add(TierPrice(tier_id=row.id, effective_from=p.effective_from,
                                     price_input_per_m=p.input_per_m,
                                     price_cached_input_per_m=p.cached_input_per_m,
                                     price_output_per_m=p.output_per_m))
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


@pytest.fixture()
def month(app):
    """Two tenants (departments), three tiers, 3000 requests in October 2026, frontier
    price cut on the 15th at noon."""
    change = simulate.mid_month(PERIOD)
    tiers = seed_catalog(change)
    tenants = [TenantFactory(name="revops", department="Revenue Ops"),
               TenantFactory(name="legal", department="Legal")]
    wfs = seed_workflows(tenants)
    rows = insert_rows(simulate.generate_month(PERIOD, wfs, tiers, 3000, seed=11))
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
