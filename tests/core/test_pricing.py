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
