from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from app.core.pricing import baseline_cost, baseline_tier, request_cost

T1 = {"name": "tier-1", "rank": 1, "price_input_per_m": "0.06",
      "price_cached_input_per_m": "0.015", "price_output_per_m": "0.18"}
T3 = {"name": "tier-3", "rank": 3, "price_input_per_m": "3.50",
      "price_cached_input_per_m": "0.875", "price_output_per_m": "10.50"}


def test_cost_splits_cached_and_uncached_input():
    # 1000 in (400 cached), 200 out on tier 1
    cost = request_cost(T1, 1000, 400, 200)
    assert cost == (600 * Decimal("0.06") + 400 * Decimal("0.015")
                    + 200 * Decimal("0.18")) / 1_000_000
    assert cost == Decimal("0.000078")


def test_baseline_is_top_rank_tier_without_reuse():
    assert baseline_tier([T3, T1])["name"] == "tier-3"
    assert baseline_cost([T1, T3], 1000, 200) == Decimal("0.0056")
    assert baseline_cost([], 1000, 200) == 0


def test_cached_clamped_to_prompt():
    assert request_cost(T1, 10, 50, 0) == 10 * Decimal("0.015") / 1_000_000
    assert request_cost(T1, 10, -5, 0) == 10 * Decimal("0.06") / 1_000_000


@given(st.integers(0, 10**7), st.integers(0, 10**7), st.integers(0, 10**6))
def test_cost_never_negative_and_never_above_baseline(prompt, cached, out):
    cost = request_cost(T1, prompt, cached, out)
    assert 0 <= cost <= baseline_cost([T1, T3], prompt, out)


def test_schedule_price_applies_from_its_instant_on():
    from datetime import datetime, timezone

    from app.core.pricing import prices_at, tier_cost
    t0 = datetime(2027, 1, 1, tzinfo=timezone.utc)
    t1 = datetime(2027, 2, 1, tzinfo=timezone.utc)
    tier = {**T1, "price_schedule": [
        {"from_ts": t0.timestamp(), "price_input_per_m": "0.05",
         "price_cached_input_per_m": "0.01", "price_output_per_m": "0.15"},
        {"from_ts": t1.timestamp(), "price_input_per_m": "0.04",
         "price_cached_input_per_m": "0.01", "price_output_per_m": "0.12"}]}
    assert prices_at(tier, t0.timestamp() - 1) is tier
    assert prices_at(tier, t0)["price_input_per_m"] == "0.05"
    assert prices_at(tier, t1)["price_output_per_m"] == "0.12"
    assert tier_cost(tier, t1, 1000, 0, 1000) == Decimal("0.00016")
    assert baseline_cost([T1, {**T3, "rank": 4, "price_schedule": tier["price_schedule"]}],
                         1000, 1000, t1) == Decimal("0.00016")


# --- savings per stage (issue 24) ------------------------------------------------------

T2 = {"name": "tier-2", "rank": 2, "price_input_per_m": "0.35",
      "price_cached_input_per_m": "0.0875", "price_output_per_m": "1.05"}


def test_stage_savings_waterfall_on_a_served_request():
    from app.core.pricing import book_cost, stage_savings
    low = {"reason": "low_margin", "cost_usd": "0.0000123"}
    got = stage_savings([T1, T2, T3], T2, None, 1000, 400, 120, 200, [low])
    assert got["routing"] == baseline_cost([T3], 1000, 200) - request_cost(T2, 1000, 0, 200)
    assert got["minify"] == 80 * Decimal("1.05") / 1_000_000       # 80 output tokens saved
    assert got["prefix"] == 400 * (Decimal("0.35") - Decimal("0.0875")) / 1_000_000
    assert got["escalation"] == Decimal("-0.0000123") and got["cache"] == 0
    cost, baseline = book_cost([T1, T2, T3], T2, None, 1000, 400, 120, 200)
    assert sum(got.values()) == baseline - (cost + Decimal("0.0000123"))


def test_stage_savings_cache_hit_and_schema_retry():
    from app.core.pricing import stage_savings
    hit = stage_savings([T1, T3], None, None, 500, 0, 50, cache_hit=True)
    assert hit["cache"] == baseline_cost([T3], 500, 50)
    assert sum(hit.values()) == hit["cache"]
    retry = stage_savings([T1, T3], T1, None, 500, 0, 50, 60,
                          [{"reason": "schema_retry", "cost_usd": "0.00001"}])
    assert retry["minify"] == 10 * Decimal("0.18") / 1_000_000 - Decimal("0.00001")
    assert retry["escalation"] == 0


@given(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**5),
       st.integers(0, 10**5), st.lists(st.decimals("0", "0.5", places=12), max_size=3),
       st.sampled_from([None, "T1", "T2", "T3"]))
def test_stage_savings_add_up_to_the_ledger_rounded_saving(prompt, cached, out, extra,
                                                             attempts, served):
    from app.core.costing import to_ledger
    from app.core.pricing import STAGES, book_cost, stage_savings
    tier = {"T1": T1, "T2": T2, "T3": T3}.get(served or "")
    tiers = [T1, T2, T3]
    tries = [{"reason": "low_margin", "cost_usd": str(a)} for a in attempts]
    got = stage_savings(tiers, tier, None, prompt, cached, out, out + extra, tries,
                        cache_hit=tier is None)
    assert list(got) == list(STAGES)
    cost, baseline = book_cost(tiers, tier, None, prompt, cached, out, out + extra)
    cost += sum(attempts, Decimal(0))
    assert sum(got.values()) == to_ledger(baseline) - to_ledger(cost)
    assert all(v == to_ledger(v) for v in got.values())
