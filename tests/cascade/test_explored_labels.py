"""Tier-1 exploration verdicts count for the router only while tier 1 still answers the
workflow with what was explored: the base model's failures stop counting once an adapter
is promoted (they would teach the router that the adapter fails), and an adapter's
verdicts stop counting once it no longer serves."""
from datetime import datetime, timezone

from app.adapters.models import Adapter
from app.cascade.traces import explored_verdicts, serving_arms
from app.extensions import db
from app.ledger.models import LedgerEntry
from tests.factories import TenantFactory


def explored(tenant_id: int, rid: str, adapter: str | None, agreed: bool) -> None:
    db.session.add(LedgerEntry(
        request_id=f"{rid}-explore", tenant_id=tenant_id, workflow="wfA", kind="shadow",
        at=datetime.now(timezone.utc),
        payload={"explore": True, "shadow_of": rid, "tier_rank": 1, "agreed": agreed,
                 "adapter": adapter}))


def test_tier_one_verdicts_follow_the_serving_adapter(app):
    t = TenantFactory()
    scope = f"tenant:{t.id}:wf:wfA"
    explored(t.id, "base-1", None, False)
    explored(t.id, "ad-1", "wf-wfa-1", True)
    db.session.commit()
    # no adapter serves: the base model's verdicts count, the adapter's (a shadow's) not
    assert explored_verdicts(scope) == {"base-1": {"1": False}}

    a = Adapter(tenant_id=t.id, workflow="wfA", name="wf-wfa-1", state="canary", canary_pct=5)
    db.session.add(a)
    db.session.commit()
    # a canary shares traffic with the base model: both arms are tier 1 now
    assert serving_arms()[(t.id, "wfA")] == {"wf-wfa-1", None}
    assert explored_verdicts(scope) == {"base-1": {"1": False}, "ad-1": {"1": True}}

    a.state = "promoted"
    db.session.commit()
    assert explored_verdicts(scope) == {"ad-1": {"1": True}}

    a.state = "rolled_back"
    db.session.commit()
    assert explored_verdicts(scope) == {"base-1": {"1": False}}


def test_an_adapters_shadow_verdicts_label_tier_one_once_it_serves(app):
    """The shadow phase's verdicts (same routed body, same concordance rule) are tier-1
    labels of the adapter from the moment it serves, and never while it only shadows."""
    t = TenantFactory()
    scope = f"tenant:{t.id}:wf:wfA"
    explored(t.id, "r-1", None, False)   # exploration of the base model
    db.session.add(LedgerEntry(
        request_id="r-1-shadow", tenant_id=t.id, workflow="wfA", kind="shadow",
        at=datetime.now(timezone.utc), adapter="wf-wfa-2",
        payload={"shadow_of": "r-1", "adapter": "wf-wfa-2", "tier_rank": 1, "agreed": True}))
    db.session.add(LedgerEntry(     # an older row without its tier: not a label
        request_id="r-2-shadow", tenant_id=t.id, workflow="wfA", kind="shadow",
        at=datetime.now(timezone.utc), adapter="wf-wfa-2",
        payload={"shadow_of": "r-2", "adapter": "wf-wfa-2", "agreed": True}))
    a = Adapter(tenant_id=t.id, workflow="wfA", name="wf-wfa-2", state="shadow")
    db.session.add(a)
    db.session.commit()
    assert explored_verdicts(scope) == {"r-1": {"1": False}}
    a.state = "promoted"
    db.session.commit()
    assert explored_verdicts(scope) == {"r-1": {"1": True}}
