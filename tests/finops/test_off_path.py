"""Off-path runs in FinOps: the gateway's tier-1 exploration / adapter shadow runs (kind
``shadow``) and its cache verification runs (kind ``cache_verify``, issue 22) reach the
ledger through the stream and its drain, stay out of every rollup, budget and total, and
show on a line of their own on the dashboard, in its API and as a CSV, cache verification
labelled as such and scoped per tenant like every report."""
from __future__ import annotations

import csv
import io
from datetime import datetime, timezone
from decimal import Decimal

import orjson

from app.extensions import db
from app.finops import reports, rollups
from app.finops.service import ledger_month_spend
from app.ledger.models import LedgerEntry
from app.ledger.service import drain_stream
from app.redis_client import get_redis, keys
from tests.factories import UserFactory
from tests.finops.conftest import PERIOD, api_token, login

AT = datetime(2026, 10, 20, 9, 30, tzinfo=timezone.utc)


def off_path_event(tenant_id: int, rid: str, kind: str, cost: str) -> dict:
    payload = ({"verify_of": rid, "entry": "req_cached", "agreed": False,
                "entry_outcome": "evicted"} if kind == "cache_verify"
               else {"shadow_of": rid, "explore": True, "tier_rank": 1, "agreed": True})
    return {"request_id": f"{rid}-{'verify' if kind == 'cache_verify' else 'explore'}",
            "at": AT.isoformat(), "tenant_id": tenant_id, "workflow": "", "workflow_name": "",
            "tier": "tier-1", "model": "tiny-served", "status": 200, "cache": "miss",
            "prompt_tokens": 40, "cached_tokens": 0, "completion_tokens": 12, "cost_usd": cost,
            "baseline_cost_usd": "0", "escalated": False, "ttft_ms": None, "latency_ms": 8.0,
            "usage_source": "upstream", "adapter": "", "kind": kind, "payload": payload}


def test_off_path_runs_are_on_no_budget_or_total_and_show_on_their_own_line(month, client):
    revops, legal = month["tenants"]
    rollups.rebuild_all()
    finops = UserFactory(role="finops")
    period = reports.parse_period(PERIOD)
    before = reports.dashboard(finops, period)["totals"]
    spend_before = ledger_month_spend(PERIOD)

    events = [off_path_event(revops.id, "req_v1", "cache_verify", "0.0125"),
              off_path_event(revops.id, "req_v2", "cache_verify", "0.0075"),
              off_path_event(revops.id, "req_x1", "shadow", "0.0400"),
              off_path_event(legal.id, "req_v3", "cache_verify", "0.0300")]
    get_redis().xadd(keys().ledger_stream(), {"b": orjson.dumps(events)})
    drain_stream(max_batches=10)
    kinds = dict(db.session.execute(
        db.select(LedgerEntry.request_id, LedgerEntry.kind).where(
            LedgerEntry.request_id.in_([e["request_id"] for e in events]))).all())
    assert kinds == {e["request_id"]: e["kind"] for e in events}   # ingested, kind kept

    rollups.rebuild_all()
    assert rollups.reconcile(PERIOD) == []
    after = reports.dashboard(finops, period)
    for field in ("cost", "requests", "baseline", "prompt_tokens", "completion_tokens"):
        assert after["totals"][field] == before[field], field
    assert ledger_month_spend(PERIOD) == spend_before   # what budgets reconcile against

    lines = {r["kind"]: r for r in after["off_path"]["rows"]}
    assert lines["cache_verify"]["label"] == "Cache verification"
    assert (lines["cache_verify"]["runs"], lines["cache_verify"]["cost"]) == (3, Decimal("0.05"))
    assert (lines["shadow"]["runs"], lines["shadow"]["cost"]) == (1, Decimal("0.04"))
    assert after["off_path"]["cost"] == Decimal("0.09")
    mine = reports.dashboard(finops, period, legal.id)["off_path"]
    assert {r["kind"]: (r["runs"], r["cost"]) for r in mine["rows"]} == {
        "cache_verify": (1, Decimal("0.03")), "shadow": (0, Decimal(0))}

    login(client, finops)
    page = client.get(f"/finops?period={PERIOD}").get_data(as_text=True)
    assert 'id="kpi-off-path"' in page
    assert '<span data-kind="cache_verify">Cache verification $0.05 (3 runs)</span>' in page
    assert '<span data-kind="shadow">Exploration and adapter shadow $0.04 (1 run)</span>' in page
    rows = list(csv.reader(io.StringIO(client.get(
        f"/finops/export/off_path.csv?period={PERIOD}").get_data(as_text=True))))
    assert rows == [["kind", "label", "runs", "cost_usd"],
                    ["shadow", "Exploration and adapter shadow", "1", "0.04"],
                    ["cache_verify", "Cache verification", "3", "0.05"],
                    ["total", "Off-path runs (on no budget)", "4", "0.09"]]

    lead = UserFactory(role="viewer", tenant=legal)
    data = client.get(f"/api/v1/finops/dashboard?period={PERIOD}",
                      headers={"Authorization": f"Bearer {api_token(lead)}"}).get_json()
    assert Decimal(data["off_path"]["cost"]) == Decimal("0.03")
    assert client.get(f"/api/v1/finops/export/off_path.csv?tenant={revops.id}",
                      headers={"Authorization": f"Bearer {api_token(lead)}"}).status_code == 403
