"""The verified cache through the running gateway (issue 22): an answer serves its
paraphrases only once verified (here: a validator's "pass" on /v1/feedback); a paraphrase
that met an unverified candidate is a miss whose fresh answer is compared with it, and a
disagreeing entry is evicted, with the evidence counted for the tenant."""
from __future__ import annotations

import httpx

from tests.gateway.conftest import make_world, wait_for

SYSTEM = {"role": "system", "content": "You answer geography questions."}
ASK = [SYSTEM, {"role": "user", "content": "What is the capital city of France?"}]
REWORDED = [SYSTEM, {"role": "user", "content": "What's the capital city of France?"}]
ASK_IT = [SYSTEM, {"role": "user", "content": "What is the capital city of Italy?"}]
REWORDED_IT = [SYSTEM, {"role": "user", "content": "What's the capital city of Italy?"}]


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
