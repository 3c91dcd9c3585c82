"""S00 embeds a request only when the vector can change the answer, through the running
gateway: a question whose bucket (tenant, system prompt, entities ...) holds nothing is
probed without an embedding yet stored with one after the answer, so its paraphrase is a
semantic hit; an exact repeat needs none."""
from __future__ import annotations

from tests.gateway.conftest import make_world, wait_for

SYSTEM = {"role": "system", "content": "You answer geography questions."}
ASK = [SYSTEM, {"role": "user", "content": "What is the capital city of France?"}]
REWORDED = [SYSTEM, {"role": "user", "content": "What's the capital city of France?"}]
OTHER_ENTITY = [SYSTEM, {"role": "user", "content": "What is the capital city of Spain?"}]


def _probe_embedded(row) -> bool:
    return row.payload["pipeline"]["cache_probe_embedded"]


def test_the_probe_embeds_only_where_something_could_match(app, gateway, fake_replicas,
                                                           frontier, redis_client):
    ns = app.config["REDIS_NAMESPACE"]
    w = make_world(app, gateway, [s.url for s in fake_replicas], frontier.url,
                   policy={"cache_similarity_threshold": 0.95, "cache_verified_only": False})
    client = w.client()

    def ask(messages) -> str:
        raw = client.chat.completions.with_raw_response.create(
            model="tier-1", messages=messages, temperature=0)
        return raw.headers["x-sluice-cache"]

    assert ask(ASK) == "miss"
    # stored after the answer, with a vector made then
    wait_for(lambda: redis_client.scard(f"{ns}:cache:t:{w.tenant.id}") >= 1, what="store")
    assert ask(REWORDED) == "semantic"
    assert ask(ASK) == "exact"
    assert ask(OTHER_ENTITY) == "miss"  # another entity: another, empty, bucket

    rows = w.drain_rows(4)
    assert [r.cache for r in rows] == ["miss", "semantic", "exact", "miss"]
    assert [_probe_embedded(r) for r in rows] == [False, True, False, False]
