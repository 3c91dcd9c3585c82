import math

import pytest

from app.core.margin import (ESCALATE, MAX_TOKEN_MARGIN, PASS, UNDECIDED, MarginMonitor,
                             logprob_items, margin, token_margin, value_token_mask)


def item(token: str, p1: float, p2: float | None = None) -> dict:
    top = [{"token": token, "logprob": math.log(p1)}]
    if p2 is not None:
        top.append({"token": token + "~", "logprob": math.log(p2)})
    return {"token": token, "logprob": math.log(p1), "top_logprobs": top}


def test_token_margin_is_top1_minus_top2():
    assert token_margin(item("a", 0.6, 0.3)) == pytest.approx(math.log(2))
    # order of top_logprobs does not matter; the sampled token may not be top-1
    it = {"token": "b", "logprob": math.log(0.3),
          "top_logprobs": [{"token": "b", "logprob": math.log(0.3)},
                           {"token": "a", "logprob": math.log(0.6)}]}
    assert token_margin(it) == pytest.approx(math.log(2))


def test_single_alternative_uses_remaining_mass_as_bound():
    assert token_margin(item("a", 0.75)) == pytest.approx(math.log(0.75 / 0.25))
    assert token_margin(item("a", 1.0)) == MAX_TOKEN_MARGIN
    assert token_margin({"token": "x", "top_logprobs": []}) == 0.0


def test_margin_means_over_masked_tokens():
    items = [item("a", 0.5, 0.5), item("b", 0.8, 0.1), item("c", 0.9, 0.05)]
    assert margin(items) == pytest.approx((0 + math.log(8) + math.log(18)) / 3)
    assert margin(items, [False, True, False]) == pytest.approx(math.log(8))
    assert math.isnan(margin(items, [False] * 3))


def test_value_tokens_exclude_keys_and_punctuation():
    toks = ['{"', 'city', '":', ' "', 'Par', 'is', '",', ' "', 'amount', '":', ' 12', '.5',
            ',"ok":', 'true', '}']
    mask = value_token_mask(toks)
    chosen = [t for t, m in zip(toks, mask) if m]
    assert chosen == ['Par', 'is', ' 12', '.5', 'true']


def test_value_tokens_across_boundaries_nesting_and_escapes():
    toks = ['```json\n', '{"a', '": ["x\\', '"y", ', '{"b":', 'nu', 'll}', '], "c": "', ':,}', '"}', '\n```']
    mask = value_token_mask(toks)
    assert mask == [False, False, True, True, False, True, True, False, True, False, False]
    # keys inside nested objects inside arrays stay keys
    assert value_token_mask(['[{"k', '":1}]']) == [False, True]
    # a string that merely looks like JSON is a value
    assert value_token_mask(['{"q":"{\\"x\\":', '1}"}']) == [True, True]


def test_no_schema_means_every_token():
    assert value_token_mask(["a", "{", '"'], schema=False) == [True, True, True]


def test_monitor_passes_confident_stream_after_window():
    mon = MarginMonitor(gamma=0.78, window_tokens=3)
    assert mon.feed([item("a", 0.9, 0.05), item("b", 0.9, 0.05)]) == UNDECIDED
    assert mon.feed([item("c", 0.9, 0.05)]) == PASS
    assert mon.feed([item("d", 0.3, 0.3)] * 10) == PASS  # the decision sticks


def test_monitor_escalates_low_margin_within_window():
    mon = MarginMonitor(gamma=0.78, window_tokens=4)
    d = [mon.feed([item(t, 0.4, 0.35)]) for t in "abcd"]
    assert d == [UNDECIDED, UNDECIDED, UNDECIDED, ESCALATE]
    assert mon.margin == pytest.approx(math.log(0.4 / 0.35))


def test_monitor_counts_only_value_tokens_with_schema():
    mon = MarginMonitor(gamma=0.78, window_tokens=2, schema=True)
    # key tokens are uncertain but do not count; the two value tokens are confident
    stream = [item('{"', 0.3, 0.3), item("name", 0.3, 0.3), item('":"', 0.3, 0.3),
              item("Ada", 0.95, 0.01)]
    assert mon.feed(stream) == UNDECIDED
    assert mon.value_tokens == 1
    assert mon.feed([item(" Lovelace", 0.95, 0.01)]) == PASS


def test_monitor_decides_at_end_when_short():
    low = MarginMonitor(gamma=0.78, window_tokens=12)
    low.feed([item("a", 0.4, 0.4)])
    assert low.finish() == ESCALATE
    high = MarginMonitor(gamma=0.78, window_tokens=12)
    high.feed([item("a", 0.99, 0.001)])
    assert high.finish() == PASS
    assert MarginMonitor(gamma=0.78, window_tokens=12).finish() == PASS
    # a schema request whose answer has no JSON value falls back to all tokens
    nojson = MarginMonitor(gamma=0.78, window_tokens=12, schema=True)
    nojson.feed([item("sorry", 0.4, 0.4)])
    assert nojson.finish() == ESCALATE


def test_logprob_items_reads_openai_shape():
    body = {"choices": [{"logprobs": {"content": [item("a", 0.9, 0.1)]}}]}
    assert len(logprob_items(body)) == 1
    assert logprob_items({"choices": [{"delta": {}}]}) == []
    assert logprob_items({}) == []


def cascade(attempts, gamma=0.78, window=3):
    """What a client receives when each tier's stream goes through a HeldStream in turn."""
    from app.core.margin import HeldStream
    sent, tiers_tried = [], []
    for tier, events in attempts:
        tiers_tried.append(tier)
        hold = HeldStream(MarginMonitor(gamma=gamma, window_tokens=window))
        decision = None
        for ev in events:
            decision, out = hold.push(ev, [ev["lp"]])
            sent.extend(out)
            if decision == ESCALATE:
                break
        if decision != ESCALATE:
            decision, out = hold.end()
            sent.extend(out)
        if decision == PASS:
            return sent, tiers_tried
    return sent, tiers_tried


def ev(tier, tok, p1, p2):
    return {"tier": tier, "token": tok, "lp": item(tok, p1, p2)}


def test_escalated_stream_contains_only_the_higher_tiers_tokens():
    low = [ev(1, t, 0.4, 0.35) for t in "abcdef"]
    high = [ev(2, t, 0.95, 0.01) for t in "uvwxyz"]
    sent, tried = cascade([(1, low), (2, high)])
    assert tried == [1, 2]
    assert [e["tier"] for e in sent] == [2] * 6
    assert "".join(e["token"] for e in sent) == "uvwxyz"


def test_confident_first_tier_streams_through_and_short_streams_decide_at_end():
    sent, tried = cascade([(1, [ev(1, t, 0.95, 0.01) for t in "abcde"]), (2, [])])
    assert tried == [1] and "".join(e["token"] for e in sent) == "abcde"
    # fewer tokens than the window: held to the end, then dropped because the margin is low
    sent, tried = cascade([(1, [ev(1, "a", 0.4, 0.35)]), (2, [ev(2, "b", 0.9, 0.01)])])
    assert tried == [1, 2] and [e["tier"] for e in sent] == [2]
