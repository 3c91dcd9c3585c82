"""Template lint on plain prompts, then fed from traffic through real Redis."""
from __future__ import annotations

import time

from app.core.template_lint import find_dynamic, lint_samples, tokens_lost_per_day
from app.contract.lint import analyze_workflow, lint_report, record_prompt_sample

STATIC = "You are the billing assistant of Acme. Follow the policies below.\n" + \
         "Policy: refunds within 30 days. " * 400


def test_patterns_name_common_dynamic_content():
    text = ("Now: 2026-12-02T17:52:33Z. request_id=ab12cd34ef Hello, Alice Smith. "
            "id 123e4567-e89b-12d3-a456-426614174000 mail bob@example.com Dec 2, 2026")
    kinds = [f.kind for f in find_dynamic(text)]
    assert kinds == ["timestamp", "request_id", "user_name", "uuid", "email", "date"]
    assert find_dynamic(STATIC) == []


def test_timestamp_at_line_one_costs_the_whole_prompt():
    samples = [f"Current time: 2026-12-02T17:{m:02d}:0{m % 10}Z\n{STATIC}" for m in range(5)]
    res = lint_samples(samples)
    assert res.confirmed and res.kind == "timestamp"
    assert res.first_dynamic_token == 4                       # "Current time: " ~ 14 chars
    assert res.cacheable_tokens_lost > 3000
    assert tokens_lost_per_day(res, 10_000) == res.cacheable_tokens_lost * 10_000


def test_static_date_is_not_blamed_and_late_names_cost_little():
    samples = [f"Knowledge cutoff 2024-06-01.\n{STATIC}\nThe user is {n}." for n in
               ("Alice Martin", "Bob Stone", "Chen Li")]
    res = lint_samples(samples)
    assert res.confirmed
    assert res.first_dynamic_token > 3000                     # after the static body
    assert res.cacheable_tokens_lost < 10


def test_identical_samples_have_nothing_dynamic():
    res = lint_samples([STATIC, STATIC, STATIC])
    assert res.first_dynamic_token is None and res.cacheable_tokens_lost == 0


def test_single_sample_is_only_suspected():
    res = lint_samples([f"Session 123e4567-e89b-12d3-a456-426614174000\n{STATIC}"])
    assert res.kind == "uuid" and not res.confirmed and res.first_dynamic_token == 2


def test_traffic_samples_in_redis_feed_the_report(app, redis_client):
    ns = app.config["REDIS_NAMESPACE"] + ":lint1"
    now = time.time()
    for i in range(30):
        record_prompt_sample(redis_client, ns, 7, "wf-ts",
                             f"Request id: req_{i:08d}\n{STATIC}", now=now)
        record_prompt_sample(redis_client, ns, 7, "wf-clean", STATIC, now=now)
        record_prompt_sample(redis_client, ns, 8, "wf-other", STATIC + str(i), now=now)
    # yesterday's count is the per-day figure when present
    redis_client.set(f"{ns}:lint:7:wf-ts:n:" + time.strftime("%Y%m%d", time.gmtime(now - 86400)),
                     1000)
    row = analyze_workflow(redis_client, ns, "7:wf-ts", now=now)
    assert row["kind"] == "request_id" and row["confirmed"]
    assert row["first_dynamic_token"] == 0
    assert row["requests_per_day"] == 1000
    assert row["tokens_lost_per_day"] == row["tokens_lost_per_request"] * 1000
    assert redis_client.llen(f"{ns}:lint:7:wf-ts:samples") == 12
    report = lint_report(redis_client, ns, tenant_id=7, now=now)
    assert [r["workflow"] for r in report] == ["wf-ts", "wf-clean"]
    assert report[1]["first_dynamic_token"] is None
    assert {r["tenant_id"] for r in lint_report(redis_client, ns, now=now)} == {7, 8}
