"""γ calibration per model and tier (issue 24): on a labelled set, a higher recall target
moves γ up and a higher precision target moves it down; the CLI, the Routing page and the
API fit it, show the curve and save it on the tier, which the gateway's S04 then uses."""
from __future__ import annotations

import json
import random
import re
from pathlib import Path

import orjson
import pytest

from app.catalog.models import Tier
from app.contract.snapshot import Snapshot
from app.core import margin_calibration as mc
from app.extensions import db
from app.gateway.context import RequestContext
from app.gateway.stages.s04_margin import gamma as s04_gamma
from app.ledger.models import LedgerEntry
from tests.cascade.test_views import csrf, login
from tests.factories import TenantFactory, TierFactory, UserFactory

# per-item results of bench/margin.py's 216-item SmolLM2 run: margin and correct
RECORDED = Path(__file__).resolve().parents[2] / "bench" / "data" / "margin_results_smollm2.jsonl"


def _recorded() -> tuple[list[float], list[bool]]:
    rows = [json.loads(line) for line in RECORDED.read_text().splitlines() if line.strip()]
    return mc.labelled((r["margin_window"], r["correct"]) for r in rows)


def test_recall_target_up_moves_gamma_up_precision_target_up_moves_it_down():
    margins, correct = _recorded()
    assert len(margins) == 216
    by_recall = [mc.fit_gamma(margins, correct, "recall", t) for t in (0.2, 0.5, 0.8)]
    gammas = [f["gamma"] for f in by_recall]
    assert gammas[0] < gammas[1] < gammas[2], gammas
    for f in by_recall:   # each reaches its target, and the next γ down would not
        assert f["point"]["recall"] >= f["target"]
        lower = [p for p in f["curve"] if p["gamma"] < f["gamma"]]
        assert lower and lower[-1]["recall"] < f["target"]
    by_precision = [mc.fit_gamma(margins, correct, "precision", t) for t in (0.6, 0.7, 0.8)]
    gammas = [f["gamma"] for f in by_precision]
    assert gammas[0] > gammas[1] > gammas[2], gammas
    for f in by_precision:
        assert f["point"]["precision"] >= f["target"]
        higher = [p for p in f["curve"] if p["gamma"] > f["gamma"]]
        assert all(p["precision"] < f["target"] for p in higher)
    impossible = mc.fit_gamma(margins, correct, "precision", 1.0)
    assert impossible["gamma"] is None and "no γ reaches" in impossible["reason"]


def _tier1() -> Tier:
    tier = TierFactory(name="tier-1", rank=1, model="smollm2")
    TierFactory(name="tier-3", rank=3, model="frontier")
    db.session.commit()
    return tier


def _ledger(tier: Tier, n: int = 200, seed: int = 3) -> None:
    """Served tier-1 answers with S04's margin and the client's verdict: the lower the
    margin, the likelier wrong (a monitor that means something)."""
    rnd = random.Random(seed)
    tenant = TenantFactory()
    for i in range(n):
        m = rnd.uniform(0.8, 5.0)
        ok = rnd.random() < (m - 0.5) / 4.5
        db.session.add(LedgerEntry(
            request_id=f"g-{seed}-{i}", tenant_id=tenant.id, tier=tier.name, model=tier.model,
            cache="miss", payload={"pipeline": {"margin_checks": [
                {"tier": tier.name, "margin": round(m, 4), "tokens": 12, "value_tokens": 8,
                 "decision": "pass"}]}, "feedback": {"pass": ok, "note": "", "at": None}}))
    # an escalated check (no label: never served) and a served one without a verdict
    db.session.add(LedgerEntry(request_id=f"g-{seed}-esc", tenant_id=tenant.id, tier="tier-3",
                               cache="miss", payload={"pipeline": {"margin_checks": [
                                   {"tier": tier.name, "margin": 0.2, "decision": "escalate"}]},
                                   "feedback": {"pass": True}}))
    db.session.add(LedgerEntry(request_id=f"g-{seed}-nolabel", tenant_id=tenant.id,
                               tier=tier.name, cache="miss", payload={"pipeline": {
                                   "margin_checks": [{"tier": tier.name, "margin": 1.0,
                                                      "decision": "pass"}]}}))
    db.session.commit()


def test_ledger_calibration_saves_gamma_on_the_tier_and_s04_uses_it(app):
    from app.audit.service import SYSTEM
    from app.cascade.gamma import calibrate, ledger_traces
    from app.snapshot.service import publish
    tier = _tier1()
    _ledger(tier)
    assert len(ledger_traces(tier)) == 200      # the escalated and the unjudged left out
    low = calibrate(SYSTEM, "tier-1", "recall", 0.4)
    high = calibrate(SYSTEM, tier.id, "recall", 0.8)
    assert low["gamma"] < high["gamma"] and not low["saved"]
    assert db.session.get(Tier, tier.id).margin_gamma is None   # a dry run changes nothing
    saved = calibrate(SYSTEM, "tier-1", "recall", 0.8, save=True)
    assert saved["saved"] and db.session.get(Tier, tier.id).margin_gamma == high["gamma"]
    publish()
    from app.redis_client import get_redis, keys
    snap = Snapshot(orjson.loads(get_redis().get(keys().snapshot_data())))
    entry = snap.tiers_by_name["tier-1"]
    assert entry["margin_gamma"] == high["gamma"]
    ctx = RequestContext(request_id="r", snapshot=snap, tenant={"policy": {"margin_gamma": 0.78}},
                         key={}, body={})
    ctx.tier = entry
    assert s04_gamma(ctx) == high["gamma"]
    ctx.tier = snap.tiers_by_name["tier-3"]
    assert s04_gamma(ctx) == 0.78                # no γ of its own: the policy's


def test_cli_fits_on_a_labelled_file_and_saves(app, runner, tmp_path):
    tier = _tier1()
    rows = [json.loads(line) for line in RECORDED.read_text().splitlines() if line.strip()]
    path = tmp_path / "traces.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    dry = runner.invoke(args=["sluice", "calibrate-gamma", "--tier", "tier-1", "--recall", "0.5",
                              "--traces", str(path)])
    assert dry.exit_code == 0, dry.output
    assert "216 labelled traces, 111 wrong" in dry.output and "dry run" in dry.output
    got = float(re.search(r"γ = ([\d.]+) for recall", dry.output).group(1))
    margins, correct = _recorded()
    assert got == mc.fit_gamma(margins, correct, "recall", 0.5)["gamma"]
    assert db.session.get(Tier, tier.id).margin_gamma is None
    saved = runner.invoke(args=["sluice", "calibrate-gamma", "--tier", "tier-1", "--recall",
                                "0.8", "--traces", str(path), "--save"])
    assert saved.exit_code == 0 and "saved on the tier" in saved.output
    db.session.expire_all()
    assert db.session.get(Tier, tier.id).margin_gamma > got
    both = runner.invoke(args=["sluice", "calibrate-gamma", "--tier", "tier-1"])
    assert both.exit_code != 0 and "one of --recall or --precision" in both.output


def test_routing_page_shows_the_curve_and_saves_gamma(app, client):
    tier = _tier1()
    _ledger(tier)
    viewer = UserFactory(role="viewer")
    login(client, viewer)
    assert client.get("/router/gamma").status_code == 403
    ops = UserFactory(role="ops")
    login(client, ops)
    assert "gamma-link" in client.get("/router/").text
    page = client.get(f"/router/gamma?tier={tier.id}&kind=recall&target=60")
    assert page.status_code == 200
    html = page.text
    assert "Plotly.newPlot" in html and "200 labelled traces" in html
    shown = float(re.search(r"γ = <strong>([\d.]+)</strong>", html).group(1))
    resp = client.post("/router/gamma", data={"tier": str(tier.id), "kind": "recall",
                                              "target": "60", "days": "30", "model": "",
                                              "csrf_token": csrf(html)})
    assert resp.status_code == 302
    db.session.expire_all()
    assert db.session.get(Tier, tier.id).margin_gamma == shown
    again = client.get(f"/router/gamma?tier={tier.id}&kind=precision&target=90").text
    assert "in force: " + f"{shown:.4f}" in again
    bad = client.get(f"/router/gamma?tier={tier.id}&kind=recall&target=abc")
    assert bad.status_code == 422


def test_api_fits_given_traces_and_refuses_bad_input(app, client):
    from app.auth.service import create_admin_token
    tier = _tier1()
    ops = UserFactory(role="ops")
    _, token = create_admin_token(ops, "t")
    auth = {"Authorization": f"Bearer {token}"}
    margins, correct = _recorded()
    traces = [{"margin": m, "correct": c} for m, c in zip(margins, correct)]
    out = client.post("/api/v1/router/gamma", headers=auth, json={
        "tier": "tier-1", "kind": "precision", "target": 0.7, "traces": traces}).get_json()
    assert out["gamma"] == mc.fit_gamma(margins, correct, "precision", 0.7)["gamma"]
    assert out["saved"] is False and len(out["curve"]) > 100
    saved = client.post("/api/v1/router/gamma", headers=auth, json={
        "tier": tier.id, "kind": "precision", "target": 0.7, "traces": traces, "save": True})
    assert saved.status_code == 200 and saved.get_json()["saved"] is True
    db.session.expire_all()
    assert db.session.get(Tier, tier.id).margin_gamma == out["gamma"]
    for bad in ({"tier": "tier-1", "kind": "f1", "target": 0.5},
                {"tier": "tier-1", "kind": "recall", "target": 1.5},
                {"tier": "nope", "kind": "recall", "target": 0.5},
                {"tier": "tier-1", "kind": "recall", "target": 0.5, "traces": "x"},
                {"tier": "tier-1", "kind": "recall", "target": 0.5, "days": 1e308}):
        assert client.post("/api/v1/router/gamma", headers=auth, json=bad).status_code in (
            404, 422), bad
    viewer = UserFactory(role="viewer")
    _, vtoken = create_admin_token(viewer, "t")
    assert client.post("/api/v1/router/gamma", headers={"Authorization": f"Bearer {vtoken}"},
                       json={"tier": "tier-1", "kind": "recall", "target": 0.5}).status_code == 403


@pytest.mark.parametrize("kind,target", [("recall", 0.0), ("precision", 1.01)])
def test_targets_outside_zero_one_are_refused(kind, target):
    with pytest.raises(ValueError):
        mc.fit_gamma([0.5, 1.0], [False, True], kind, target)
