"""One rule for showing money: to the micro-dollar, at least the cents, no trailing zeros
past them; the gateway's budget refusal and the console use it."""
from __future__ import annotations

from decimal import Decimal

import pytest

from app.contract.budget import exhausted_message
from app.core.costing import allocate, format_usd, shown, to_micro


@pytest.mark.parametrize("amount, text", [
    ("0.0046", "$0.0046"), ("0", "$0.00"), ("12.5", "$12.50"), ("1234.5678912", "$1,234.567891"),
    ("-0.0000123", "-$0.000012"), ("0.0000004", "<$0.000001"), (None, "—"),
    (Decimal("0.0044000000"), "$0.0044"), ("0.0000005", "$0.000001")])
def test_format_usd(amount, text):
    assert format_usd(amount) == text


def test_plain_form_is_the_same_figure_for_csv():
    assert format_usd(Decimal("1234.5"), grouped=False, symbol=False) == "1234.50"
    assert format_usd(Decimal("0.00440"), grouped=False, symbol=False) == "0.0044"
    assert Decimal(format_usd(Decimal("0.0000004"), grouped=False, symbol=False)) == 0


def test_allocated_lines_add_up_to_the_shown_total():
    lines = [Decimal("0.0000004")] * 3 + [Decimal("0.1234567"), Decimal("-0.0000002")]
    parts = allocate(lines)
    assert sum(parts) == shown(sum(lines)) and all(p == shown(p) for p in parts)


def test_a_sub_cent_budget_is_refused_with_its_real_figures():
    msg = exhausted_message("acme", to_micro("0.0046"), to_micro("0.004712"), "2026-12")
    assert "budget of $0.0046 " in msg and "spent $0.004712 " in msg
