"""The Routing page's γ calibration in headless Chromium: fit on the ledger's labelled
margin checks, the Plotly curve drawn under the page's CSP, Save stores γ on the tier."""
from __future__ import annotations

import os
from pathlib import Path

from app.catalog.models import Tier
from app.extensions import db
from tests.cascade.test_gamma import _ledger, _tier1
from tests.e2e.conftest import sign_in
from tests.factories import UserFactory

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_fit_see_the_curve_and_save_gamma(app, console, page, tmp_path):
    tier = _tier1()
    _ledger(tier, n=300)
    sign_in(page, console, UserFactory(role="ops").email)
    page.goto(console + "/router/")
    page.click("#gamma-link")
    page.select_option("select[name=kind]", "recall")
    page.fill("input[name=target]", "60")
    page.click("#gamma-form button[type=submit]")
    page.wait_for_selector("#gamma-curve .main-svg", state="attached")
    text = page.inner_text("#gamma-result")
    assert "for recall ≥ 60.0%" in text and "300 labelled traces" in page.inner_text("#gamma-fit")
    gamma = float(text.split("γ = ")[1].split()[0])
    out = DOCS if os.environ.get("SLUICE_SCREENSHOTS") == "docs" else tmp_path
    page.screenshot(path=str(out / "router-gamma.png"), full_page=True)
    page.click("#gamma-save")
    page.wait_for_selector(".flash")
    assert "saved on tier-1" in page.inner_text("body")
    db.session.expire_all()
    assert db.session.get(Tier, tier.id).margin_gamma == gamma
