"""The cost model on plain data: token prices (app.core.pricing) and the money rules
(app.core.costing)."""
from datetime import datetime, timedelta, timezone
from decimal import Decimal

from hypothesis import given, strategies as st

from app.core import costing, pricing

T0 = datetime(2026, 10, 15, 12, tzinfo=timezone.utc)
OLD = {"price_input_per_m": "2.50", "price_cached_input_per_m": "1.25", "price_output_per_m": "10"}
NEW = {"effective_from": T0, "price_input_per_m": Decimal("2"),
       "price_cached_input_per_m": Decimal("0.5"), "price_output_per_m": Decimal("8")}


def test_tier_price_applies_before_the_first_change_and_the_change_from_its_date_on():
    tier = pricing.tier_with_schedule(OLD, [NEW])
    assert pricing.prices_at(tier, T0 - timedelta(microseconds=1))["price_output_per_m"] == \
        Decimal("10")
    assert pricing.prices_at(tier, T0)["price_output_per_m"] == Decimal("8")
    assert pricing.prices_at(tier, T0 + timedelta(days=3))["price_input_per_m"] == Decimal("2")


def test_request_cost_splits_cached_input_and_keeps_ten_decimals():
    prices = pricing.tier_with_schedule(OLD)
    # 1000 uncached x 2.50 + 3000 cached x 1.25 + 250 out x 10, per 1M
    assert costing.to_ledger(pricing.request_cost(prices, 4000, 3000, 250)) == \
        Decimal("0.0087500000")
    assert costing.to_ledger(pricing.request_cost(prices, 1, 0, 0)) == Decimal("0.0000025000")


def test_baseline_is_the_frontier_price_at_that_time_without_prefix_reuse():
    frontier = pricing.tier_with_schedule({**OLD, "rank": 3}, [NEW])
    before = costing.to_ledger(pricing.baseline_cost([frontier], 4000, 250,
                                                     T0 - timedelta(hours=1)))
    after = costing.to_ledger(pricing.baseline_cost([frontier], 4000, 250,
                                                    T0 + timedelta(hours=1)))
    assert before == Decimal("0.0125000000")  # 4000 x 2.5 + 250 x 10
    assert after == Decimal("0.0100000000")   # 4000 x 2 + 250 x 8


@given(st.lists(st.decimals(min_value=0, max_value=1000, places=10), min_size=1, max_size=40))
def test_allocated_cents_sum_to_the_rounded_total(amounts):
    parts = costing.allocate_cents(amounts)
    assert sum(parts) == costing.cents(sum(amounts))
    assert all(abs(p - a) < Decimal("0.01") for p, a in zip(parts, amounts))


def test_gpu_hour_is_replicas_times_gpus_times_rate_split_by_token_share():
    rates = [costing.GpuRate("H100", Decimal("2.50"), None),
             costing.GpuRate("H100", Decimal("3.00"), T0),
             costing.GpuRate("L40S", Decimal("1.10"), None)]
    assert costing.gpu_rate_at(rates, "H100", T0 - timedelta(hours=1)) == Decimal("2.50")
    assert costing.gpu_rate_at(rates, "H100", T0) == Decimal("3.00")
    assert costing.gpu_rate_at(rates, "A10", T0) is None
    hour = costing.pool_hour_cost(2, 4, Decimal("3.00"))
    assert hour == Decimal("24.00")
    parts = costing.allocate_by_tokens(hour, {"a": 1, "b": 2, "cache-hits": 0})
    assert parts["cache-hits"] == 0
    assert parts["a"] == Decimal("8.0000000000") and parts["b"] == Decimal("16.0000000000")
    odd = costing.allocate_by_tokens(Decimal("10"), {"x": 1, "y": 1, "z": 1})
    assert sum(odd.values()) == Decimal("10")
    assert costing.allocate_by_tokens(hour, {"a": 0}) == {"a": Decimal(0)}


def test_micro_dollars_round_reservations_up():
    assert costing.to_micro(Decimal("0.0000001")) == 0
    assert costing.to_micro(Decimal("0.0000001"), round_up=True) == 1
    assert costing.to_micro("12.5") == 12_500_000
    assert costing.from_micro(1_500_000) == Decimal("1.5")
