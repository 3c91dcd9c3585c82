"""FinOps charts show sparse data honestly: one day of traffic is a dated bar and points
on an axis spanning the period, and an empty period says what will appear and when."""
from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal

from app.finops.charts import dashboard_figures
from app.finops.reports import parse_period


def _data(timeline):
    return {"period": parse_period("2026-12"), "grain": "day", "timeline": timeline,
            "tier_mix": []}


def _bucket(day: int) -> dict:
    return {"bucket": datetime(2026, 12, day, tzinfo=timezone.utc), "cost": Decimal("0.0044"),
            "baseline": Decimal("0.031"), "requests": 12, "semantic_hit_pct": 8.0,
            "exact_hit_pct": 2.0, "prefix_hit_pct": 61.0, "ttft_p50": 120.0, "ttft_p95": 300.0,
            "output_per_request": 30.0, "cost_per_1k": Decimal("0.3667")}


def test_day_one_is_a_dated_bar_on_the_months_axis():
    figs = dashboard_figures(_data([_bucket(4)]))
    spend = figs["spend"]
    assert spend["data"][0]["type"] == "bar" and spend["data"][0]["y"] == [0.0044]
    assert spend["layout"]["xaxis"] == {"type": "date", "range": [
        "2026-12-01T00:00:00+00:00", "2027-01-01T00:00:00+00:00"]}
    for name in ("cache", "ttft", "unit"):
        lines = [d for d in figs[name]["data"] if d["type"] == "scatter"]
        assert lines and all(d["mode"] == "lines+markers" for d in lines), name
        assert figs[name]["layout"]["xaxis"]["type"] == "date"
    assert "annotations" not in spend["layout"]


def test_an_empty_period_says_what_will_appear_and_when():
    figs = dashboard_figures(_data([]))
    for name in ("spend", "cache", "ttft", "unit"):
        (note,) = figs[name]["layout"]["annotations"]
        assert "within one rollup" in note["text"], name
