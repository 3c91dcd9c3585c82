"""In headless Chromium over traffic through the real gateway: the Overview shows it after
one rollup (the "Refresh figures now" button runs it), and FinOps draws day one honestly.
docs/overview.png and docs/finops-day-one.png are taken here with SLUICE_SCREENSHOTS=docs."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.redis_client import get_redis, keys
from tests.e2e.conftest import sign_in
from tests.factories import UserFactory
from tests.gateway.conftest import make_world

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture()
def world(app, gateway, fake_replicas, frontier):  # noqa: F811
    get_redis().delete(keys().rollup_watermark(), keys().rollup_ran_at())
    return make_world(app, gateway, [s.url for s in fake_replicas], frontier.url)


def test_overview_shows_traffic_after_one_rollup_and_finops_day_one(world, console, page, tmp_path):
    client = world.client()
    models = ["tier-1"] * 7 + ["tier-2"] * 3 + ["tier-3"] * 2
    for i, model in enumerate(models):
        client.chat.completions.create(model=model, messages=[
            {"role": "system", "content": "Classify the ticket."},
            {"role": "user", "content": f"ticket {i}: the printer is on fire"}])
    assert len(world.drain_rows(len(models))) == len(models)

    # counted as the tenant's own ops sees it (other tests' late ledger events may land in
    # this database under their own tenants; the tenant's figures are exactly its own)
    sign_in(page, console, UserFactory(role="ops", tenant=world.tenant).email)
    page.goto(console + "/")
    assert page.inner_text("#kpi-requests .v") == "0"          # not rolled up yet
    page.click("#refresh-figures")
    page.wait_for_selector("text=Figures brought up to date")
    assert page.inner_text("#kpi-requests .v") == str(len(models))
    spend = page.inner_text("#kpi-spend .v")
    assert spend.startswith("$") and spend != "$0.00"
    assert "tier-1" in page.inner_text("#tier-mix")
    page.context.clear_cookies()
    sign_in(page, console, UserFactory(role="ops").email)      # the global view: pools too
    page.goto(console + "/")
    assert page.locator("#pools").count() == 1
    out = DOCS if os.environ.get("SLUICE_SCREENSHOTS") == "docs" else tmp_path
    page.screenshot(path=str(out / "overview.png"), full_page=True)

    page.goto(console + f"/finops?tenant={world.tenant.id}")
    for cid in ("chart-spend", "chart-cache", "chart-ttft"):
        page.wait_for_selector(f"#{cid} .main-svg", state="attached")
    # day one: the spend bar is drawn (a line through one point would draw nothing)
    assert page.locator("#chart-spend .bars path").count() >= 1
    assert page.inner_text("#kpi-spend") == spend
    page.screenshot(path=str(out / "finops-day-one.png"), full_page=True)
