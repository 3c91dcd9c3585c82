"""The verified cache through the running gateway (issue 22): an answer serves its
paraphrases only once verified (here: a validator's "pass" on /v1/feedback); a paraphrase
that met an unverified candidate is a miss whose fresh answer is compared with it, and a
disagreeing entry is evicted, with the evidence counted for the tenant.

Sampled verification: a verifier hit drawn by policy ``cache_verify_sample_pct`` is served
from the cache (cost 0) and generated again upstream off the path; the fresh answer decides
whether the entry stays (evidence for the tenant's line) or is evicted, and the run is
booked as ledger kind ``cache_verify``, never on the tenant's budget. The fake upstream
echoes the first 12 words of the question, so a reworded question gets another answer
(disagreement), unless both share their first 12 words (agreement)."""
from __future__ import annotations

from decimal import Decimal

import httpx
import orjson
import pytest

from app.contract import budget as rb
from app.core.cache_bound import bin_of
from app.core.costing import to_micro
from tests.gateway.conftest import make_world, off_path_gateway, wait_for

SYSTEM = {"role": "system", "content": "You answer geography questions."}
ASK = [SYSTEM, {"role": "user", "content": "What is the capital city of France?"}]
REWORDED = [SYSTEM, {"role": "user", "content": "What's the capital city of France?"}]
ASK_IT = [SYSTEM, {"role": "user", "content": "What is the capital city of Italy?"}]
REWORDED_IT = [SYSTEM, {"role": "user", "content": "What's the capital city of Italy?"}]

# A rewording the verifier serves (not word for word: "how many" / "the number of"), at a
# cosine above the 0.95 line these worlds use (0.97 with this system prompt)
COMPANY = {"role": "system", "content": "You answer questions about companies."}
HOW_MANY = "How many employees does Brimlock have in Texas?"
NUMBER_OF = "What is the number of employees Brimlock has in Texas?"
TWELVE_WORDS = "Please answer this question from our team briefly and plainly and clearly: "


def test_paraphrases_get_only_verified_answers(app, gateway, fake_replicas, frontier,
                                                redis_client):
    ns = app.config["REDIS_NAMESPACE"]
    w = make_world(app, gateway, [s.url for s in fake_replicas], frontier.url,
                   policy={"cache_similarity_threshold": 0.95})
    client = w.client()

    def ask(messages):
        raw = client.chat.completions.with_raw_response.create(
            model="tier-1", messages=messages, temperature=0)
        return raw.headers["x-sluice-cache"], raw.headers["x-sluice-request-id"]

    def stored(n):
        wait_for(lambda: redis_client.scard(f"{ns}:cache:t:{w.tenant.id}") >= n, what="store")

    assert ask(ASK)[0] == "miss"
    stored(1)
    # unverified: not served to the paraphrase; the fake upstream echoes the question, so
    # the fresh answer disagrees with the cached one and the entry is evicted
    assert ask(REWORDED)[0] == "miss"

    def stat(field: str) -> int:  # summed over the tenant's workflows
        return sum(int(redis_client.hget(k, field) or 0)
                   for k in redis_client.scan_iter(match=f"{ns}:cache:qs:{w.tenant.id}:*"))
    wait_for(lambda: stat("evicted") >= 1, what="eviction")
    assert stat("checked_wrong") >= 1 and stat("checked") >= 1

    status, rid = ask(ASK_IT)
    assert status == "miss"
    stored(2)
    w.wait_ledger(3)  # feedback needs the request on record
    r = httpx.post(w.base_url + "/feedback", headers={"authorization": f"Bearer {w.key}"},
                   json={"request_id": rid, "verdict": "pass"})
    assert r.status_code == 202
    assert ask(REWORDED_IT)[0] == "semantic"   # verified by the validator: served
    rows = w.drain_rows(4)
    assert rows[-1].cache == "semantic"
    assert rows[-1].payload["pipeline"]["cache_hit"]["how"] in ("fast", "verified")
    wait_for(lambda: stat("hits_fast") + stat("hits_verified") >= 1, what="hit counter")


# --- a fresh answer decides: a miss's candidate, and sampled hits off the path ------

@pytest.fixture(scope="module")
def verify_gateway(app_config, tmp_path_factory):
    """A gateway with cache verification on (the session's shared one runs with it off,
    like exploration, so that sampled hits add no rows to tests that count them)."""
    s = off_path_gateway(app_config, tmp_path_factory, "verify", GATEWAY_CACHE_VERIFY_MAX_INFLIGHT=4)
    yield s
    s.stop()


@pytest.fixture()
def vworld(app, verify_gateway, fake_replicas, frontier):
    return make_world(app, verify_gateway, [s.url for s in fake_replicas], frontier.url,
                      policy={"cache_similarity_threshold": 0.95, "cache_verify_sample_pct": 100})


def ask(w, question: str) -> httpx.Response:
    r = httpx.post(w.base_url + "/chat/completions", timeout=30,
                   headers={"authorization": f"Bearer {w.key}"},
                   json={"model": "tier-1", "temperature": 0,
                         "messages": [COMPANY, {"role": "user", "content": question}]})
    assert r.status_code == 200, r.text
    return r


def content(r: httpx.Response) -> str:
    return r.json()["choices"][0]["message"]["content"]


def verified_entry(w, redis_client, ns: str, question: str) -> httpx.Response:
    """``question`` asked (a miss, stored) and passed by a validator: it serves rewordings."""
    first = ask(w, question)
    assert first.headers["x-sluice-cache"] == "miss"
    wait_for(lambda: redis_client.scard(f"{ns}:cache:t:{w.tenant.id}") >= 1, what="store")
    w.wait_ledger(1)   # feedback needs the request on record
    r = httpx.post(w.base_url + "/feedback", headers={"authorization": f"Bearer {w.key}"},
                   json={"request_id": first.headers["x-sluice-request-id"], "verdict": "pass"})
    assert r.status_code == 202
    return first


def stats(redis_client, ns: str, tenant_id: int) -> dict[str, int]:
    """The tenant's cache counters, summed over its workflows."""
    out: dict[str, int] = {}
    for key in redis_client.scan_iter(match=f"{ns}:cache:qs:{tenant_id}:*"):
        for k, v in redis_client.hgetall(key).items():
            out[k.decode()] = out.get(k.decode(), 0) + int(v)
    return out


def upstream_calls(replicas) -> int:
    return sum(httpx.get(s.url + "/stats", timeout=5).json()["requests"] for s in replicas)


def spent(redis_client, app, tenant_id) -> int:
    return rb.state(redis_client, app.config["REDIS_NAMESPACE"], tenant_id)["spent_micro"]


def test_an_answer_serves_rewordings_once_a_fresh_answer_agreed_with_it(
        app, gateway, fake_replicas, frontier, redis_client):
    """No validator: a rewording that met the unverified entry is a miss, and its fresh
    answer, equal to the cached one (the fake echoes the same first 12 words), verifies the
    entry; the fresh answer itself is stored verified (produced twice). Each then serves a
    rewording nearest to it."""
    ns = app.config["REDIS_NAMESPACE"]
    w = make_world(app, gateway, [s.url for s in fake_replicas], frontier.url,
                   policy={"cache_similarity_threshold": 0.95})

    def stored(n):
        wait_for(lambda: redis_client.scard(f"{ns}:cache:t:{w.tenant.id}") >= n, what="store")

    first = ask(w, TWELVE_WORDS + HOW_MANY)
    assert first.headers["x-sluice-cache"] == "miss"
    stored(1)
    second = ask(w, TWELVE_WORDS + NUMBER_OF)   # unverified: not served, checked
    assert second.headers["x-sluice-cache"] == "miss" and content(second) == content(first)
    stored(2)
    wait_for(lambda: stats(redis_client, ns, w.tenant.id).get("verified", 0) >= 1,
             what="the entry verified")
    counters = stats(redis_client, ns, w.tenant.id)
    assert counters["checked"] == 1 and counters.get("checked_wrong", 0) == 0
    assert counters.get("evicted", 0) == 0

    # nearest to the first question (cosine 0.99 against 0.98): served from its entry
    near_first = ask(w, TWELVE_WORDS + HOW_MANY[:-1] + " currently?")
    # nearest to the second (0.99 against 0.98): served from the answer produced twice
    near_second = ask(w, TWELVE_WORDS + NUMBER_OF[:-1] + " currently?")
    for r in (near_first, near_second):
        assert r.headers["x-sluice-cache"] == "semantic" and content(r) == content(first)
    rows = {r.request_id: r for r in w.drain_rows(4)}
    served_from = [rows[r.headers["x-sluice-request-id"]].payload["pipeline"]["cache_hit"]
                   ["of_request"] for r in (near_first, near_second)]
    assert served_from == [first.headers["x-sluice-request-id"],
                           second.headers["x-sluice-request-id"]]


def test_a_sampled_hit_is_served_from_the_cache_and_a_disagreeing_entry_is_evicted(
        app, vworld, fake_replicas, redis_client):
    from app.finops.service import ledger_month_spend
    w, ns = vworld, app.config["REDIS_NAMESPACE"]
    first = verified_entry(w, redis_client, ns, HOW_MANY)
    calls = upstream_calls(fake_replicas)

    hit = ask(w, NUMBER_OF)
    # served from the cache: the cached answer, at cost 0
    assert hit.headers["x-sluice-cache"] == "semantic"
    assert content(hit) == content(first) and Decimal(hit.headers["x-sluice-cost-usd"]) == 0
    hit_id = hit.headers["x-sluice-request-id"]

    rows = w.drain_rows(3)   # the miss, the hit, and the hit's verification run
    by_id = {r.request_id: r for r in rows}
    served = by_id[hit_id]
    assert served.kind == "request" and served.cache == "semantic" and served.cost_usd == 0
    note = served.payload["pipeline"]["cache_hit"]
    assert note["how"] == "verified" and note["sampled"] is True and note["tier"] == "tier-1"

    # ... and generated again upstream, off the path, booked as cache verification
    run = by_id[f"{hit_id}-verify"]
    assert run.kind == "cache_verify" and run.tier == "tier-1" and run.model == "tiny-served"
    assert upstream_calls(fake_replicas) == calls + 1
    assert run.completion_tokens > 0 and run.baseline_cost_usd == 0
    uncached = run.prompt_tokens - run.cached_tokens   # tier 1: $0.06 in, $0.015, $0.18 out
    assert run.cost_usd == (uncached * Decimal("0.06") + run.cached_tokens * Decimal("0.015")
                            + run.completion_tokens * Decimal("0.18")) / 1_000_000 > 0
    p = run.payload
    assert (p["verify_of"], p["entry"], p["metric"]) == (
        hit_id, first.headers["x-sluice-request-id"], "exact")
    # the fake echoes the reworded question: the answers disagree, the entry is evicted
    assert p["agreed"] is False and p["entry_outcome"] == "evicted"
    counters = stats(redis_client, ns, w.tenant.id)
    assert counters["sampled"] == 1 and counters["sampled_wrong"] == 1
    assert counters["evicted"] == 1 and counters["verify_cost_usd_micros"] == to_micro(run.cost_usd)

    # never on the budget: it holds what the client paid (the first miss) and no more
    paid = sum(to_micro(r.cost_usd) for r in rows if r.kind == "request")
    wait_for(lambda: spent(redis_client, app, w.tenant.id) == paid, what="settles")
    assert ledger_month_spend(rb.current_period())[w.tenant.id] == sum(
        r.cost_usd for r in rows if r.kind == "request")

    again = ask(w, NUMBER_OF)   # the entry is gone: the reworded question misses
    assert again.headers["x-sluice-cache"] == "miss"
    assert content(again) != content(first)
    w.drain_rows(4)


def test_a_sampled_hit_that_agrees_keeps_its_entry_and_teaches_the_line(
        app, vworld, redis_client):
    w, ns = vworld, app.config["REDIS_NAMESPACE"]
    first = verified_entry(w, redis_client, ns, TWELVE_WORDS + HOW_MANY)
    hit = ask(w, TWELVE_WORDS + NUMBER_OF)
    assert hit.headers["x-sluice-cache"] == "semantic" and content(hit) == content(first)
    hit_id = hit.headers["x-sluice-request-id"]

    rows = w.drain_rows(3)
    run = {r.request_id: r for r in rows}[f"{hit_id}-verify"]
    # the same first 12 words: the fresh answer equals the cached one
    assert run.kind == "cache_verify" and run.cost_usd > 0
    assert run.payload["agreed"] is True and run.payload["entry_outcome"] == "verified"
    sim = run.payload["similarity"]
    counters = stats(redis_client, ns, w.tenant.id)
    assert counters["sampled"] == 1 and counters.get("sampled_wrong", 0) == 0
    assert counters.get("evicted", 0) == 0
    # the evidence for the tenant's line: one agreeing observation in this cosine's bin
    evidence = {k.decode(): int(v) for k, v in
                redis_client.hgetall(f"{ns}:cache:ev:{w.tenant.id}").items()}
    assert evidence == {f"n{bin_of(sim)}": 1}

    again = ask(w, TWELVE_WORDS + NUMBER_OF)   # kept: served again, and checked again
    assert again.headers["x-sluice-cache"] == "semantic" and content(again) == content(first)
    rows = w.drain_rows(5)
    rerun = {r.request_id: r for r in rows}[f"{again.headers['x-sluice-request-id']}-verify"]
    assert rerun.payload["agreed"] is True
    assert stats(redis_client, ns, w.tenant.id)["sampled"] == 2


def ask_streamed(w, question: str) -> tuple[httpx.Headers, str, list[dict]]:
    """``question`` with ``stream: true``: (headers, the text the chunks carry, chunks);
    the stream is read to its ``[DONE]``."""
    with httpx.stream("POST", w.base_url + "/chat/completions", timeout=30,
                      headers={"authorization": f"Bearer {w.key}"},
                      json={"model": "tier-1", "temperature": 0, "stream": True,
                            "messages": [COMPANY, {"role": "user", "content": question}]}) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [orjson.loads(line[6:]) for line in lines[:-1]]
    text = "".join((c["choices"] or [{}])[0].get("delta", {}).get("content") or ""
                   for c in chunks)
    return r.headers, text, chunks


def test_a_streamed_sampled_hit_streams_the_cached_answer_and_is_verified_off_the_path(
        app, vworld, fake_replicas, redis_client):
    """``stream: true`` on a sampled verifier hit: the client gets the cached answer as a
    chunk stream at cost 0; the same request is generated again upstream (not streamed),
    booked as ``cache_verify``, and, disagreeing, the entry is evicted."""
    w, ns = vworld, app.config["REDIS_NAMESPACE"]
    first = verified_entry(w, redis_client, ns, HOW_MANY)
    calls = upstream_calls(fake_replicas)

    headers, text, chunks = ask_streamed(w, NUMBER_OF)
    assert headers["x-sluice-cache"] == "semantic" and Decimal(headers["x-sluice-cost-usd"]) == 0
    assert text == content(first)
    hit_id = headers["x-sluice-request-id"]
    assert {c["id"] for c in chunks} == {f"chatcmpl-{hit_id}"}   # chunks name this request

    rows = w.drain_rows(3)   # the miss, the streamed hit, and the hit's verification run
    by_id = {r.request_id: r for r in rows}
    served = by_id[hit_id]
    assert served.kind == "request" and served.cache == "semantic" and served.cost_usd == 0
    assert served.payload["pipeline"]["cache_hit"]["sampled"] is True
    run = by_id[f"{hit_id}-verify"]
    assert run.kind == "cache_verify" and run.tier == "tier-1" and run.cost_usd > 0
    assert upstream_calls(fake_replicas) == calls + 1
    p = run.payload
    assert (p["verify_of"], p["entry"]) == (hit_id, first.headers["x-sluice-request-id"])
    assert p["agreed"] is False and p["entry_outcome"] == "evicted"
    counters = stats(redis_client, ns, w.tenant.id)
    assert counters["sampled"] == 1 and counters["sampled_wrong"] == 1
    assert counters["evicted"] == 1

    headers, text, _ = ask_streamed(w, NUMBER_OF)   # evicted: the rewording misses now
    assert headers["x-sluice-cache"] == "miss" and text != content(first)
    w.drain_rows(4)
