"""CD-28B (domain shift) through the running gateway: the drill's service entry point, a
tier-1 upstream that is confident on the simple workflow's prompts and unsure on long
out-of-domain ones, the S04 margin monitor, and the ledger read back from PostgreSQL."""
from __future__ import annotations

import httpx
import pytest

from app.cascade import drill
from app.cascade.drill_runs import record_domain_shift
from tests.gateway.conftest import Server, health, make_world, wait_for
from tests.gateway.test_cascade import publish_router, router_params


@pytest.fixture(scope="module")
def novice(tmp_path_factory):
    s = Server("fake", "novice-t1", log_dir=tmp_path_factory.mktemp("logs"))
    yield s
    s.stop()


def test_domain_shift_drill_against_the_gateway(app, gateway, novice, fake_replicas, frontier):
    from app.extensions import db
    from app.ledger.models import LedgerEntry
    w = make_world(app, gateway, [novice.url], frontier.url, tier2_urls=[fake_replicas[0].url],
                   policy={"frontier_first_hours": 0, "cache_enabled": False})
    # one request makes the drill's workflow known (else it would run frontier-first)
    version = health(w.gateway)["snapshot_version"]
    with httpx.Client(timeout=30) as c:
        warm = drill.send(c, w.gateway.url, w.key, "Invoice INV-1 issued in Lyon, total 1 EUR.",
                          "drill-simple-extraction", 32)
    assert warm["status"] == 200 and warm["tier"] == "tier-3"
    w.drain_rows(1)
    wait_for(lambda: health(w.gateway)["snapshot_version"] > version, what="snapshot reload")
    publish_router(w, router_params(0.95, 0.95))  # the router sends every request to tier 1

    run = record_domain_shift(w.gateway.url, w.key, n_ood=6, n_control=4, max_tokens=32,
                              ledger_wait_s=0, unmonitored_tier="tier-1",
                              reference_tier="tier-3")

    r = run.result
    assert run.status == "passed", r
    assert run.params["n_ood"] == 6 and "key" not in run.params
    assert (r["ood"]["escalation_rate"], r["control"]["escalation_rate"]) == (1.0, 0.0)
    assert r["ood"]["escalation_known"] == 6 and r["control"]["escalation_known"] == 4
    assert r["ood"]["tiers"] == {"tier-2": 6} and r["control"]["tiers"] == {"tier-1": 4}
    assert r["errors"] == 0 and r["aborted_tier_bytes_to_client"] == 0
    assert r["added_latency_ms"] is not None
    reqs = r["requests"]
    assert len(reqs) == 10 and not any(q["leaked"] for q in reqs)
    # what the clients read: only the serving tier's answer, never the aborted "Unsure:" one
    assert all(q["answer_head"].startswith("Echo:") for q in reqs)
    # task accuracy against the frontier's answers: tier 1 alone is wrong on every
    # out-of-domain prompt ("Unsure: ..."), the monitor's escalations make them right
    acc = r["accuracy"]
    assert acc["judged_by"] == "tier-3" and acc["unmonitored_tier"] == "tier-1"
    assert acc["with_monitor"] == {"ood": 1.0, "control": 1.0, "all": 1.0, "n": 10}
    assert acc["without_monitor"] == {"ood": 0.0, "control": 1.0, "all": 0.4, "n": 10}
    from tests.cascade.test_views import login
    from tests.factories import UserFactory
    with app.test_client() as client:
        login(client, UserFactory(role="ops"))
        page = client.get("/drills").get_data(as_text=True)
    assert "with the monitor 100.0%" in page and "tier-1 alone 40.0%" in page

    # the ledger shows the aborted tier-1 attempts those clients never saw
    ood_ids = [q["request_id"] for q in reqs if q["group"] == "ood"]
    w.drain_rows(1 + 10 + 20)   # the accuracy pass: each prompt to tier 1 and tier 3 too
    rows = list(db.session.scalars(
        db.select(LedgerEntry).where(LedgerEntry.request_id.in_(ood_ids))))
    assert len(rows) == 6
    for row in rows:
        (aborted,) = row.payload["attempts"]
        assert (aborted["tier"], aborted["reason"]) == ("tier-1", "low_margin")
        assert row.escalated and row.tier == "tier-2" and row.payload["escalated_from"] == [1]


def test_bad_parameters_record_nothing(app):
    from app.drills.models import DrillRun
    from app.errors import ValidationError
    from app.extensions import db
    with pytest.raises(ValidationError) as exc:
        record_domain_shift("ftp://x", "", n_ood=0)
    assert set(exc.value.errors) == {"url", "key", "n_ood"}
    assert db.session.scalar(db.select(db.func.count()).select_from(DrillRun)) == 0
