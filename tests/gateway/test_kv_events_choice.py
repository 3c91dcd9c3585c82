"""S03 with replica_choice kv_events through real gateway processes: the replica whose KV
blocks (in the Redis index the engines' events keep) cover the prompt wins; two gateway
processes make the same choice; a stale index falls back to today's rendezvous; the
gateway's prompt ids are the engine's."""
from __future__ import annotations

import json

import httpx
import pytest

from app.contract import kv_index
from app.contract.keys import Keys
from app.contract.tokenizers import chat_tokenizer
from app.core.rendezvous import ReplicaView, affinity_key, hrw_order
from app.gateway.kv_route import PromptTokens, request_chain
from tests.gateway.conftest import make_world, publish_and_wait, wait_for
from tests.servers import FRONTIER_KEY, Server

MSGS = [{"role": "system", "content": "You sort invoices into ledgers. " * 12},
        {"role": "user", "content": "Invoice 4411 from Acme for 12 chairs, where to?"}]


@pytest.fixture(scope="module")
def tokens():
    return PromptTokens(chat_tokenizer("smollm2"))


def test_prompt_ids_are_the_engines(tokens):
    tok = tokens.tok
    bodies = [{"messages": MSGS},
              {"messages": MSGS + [{"role": "assistant", "content": "Ledger 7."},
                                   {"role": "user", "content": "And <b>4412</b>?\n\n  ok"}]},
              {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi "},
                                                         {"type": "text", "text": "there"}]}]}]
    for body in bodies * 2:           # the second round comes from the piece cache
        msgs = [{**m, "content": m["content"] if isinstance(m["content"], str) else
                 "".join(p["text"] for p in m["content"])} for m in body["messages"]]
        engine = tok.encode(tok.apply_chat_template(msgs, add_generation_prompt=True,
                                                    tokenize=False), add_special_tokens=False)
        assert tokens.prompt_ids(body) == engine
    assert tokens.hits > 0


def _send(url: str, key: str, session: str) -> str:
    r = httpx.post(url + "/chat/completions", timeout=30,
                   headers={"authorization": f"Bearer {key}", "x-sluice-session": session},
                   json={"model": "tier-1", "messages": MSGS})
    assert r.status_code == 200, r.text
    return r.headers["x-fake-replica"]


def test_kv_events_choice_is_shared_by_two_gateways_and_falls_back_when_stale(
        app, gateway, fake_replicas, frontier, redis_client, tokens, app_config,
        tmp_path_factory):
    from app.extensions import db
    w = make_world(app, gateway, [s.url for s in fake_replicas], frontier.url,
                   policy={"replica_choice": "kv_events"})
    w.pool.model = "smollm2"                   # the tokenizer the gateway loads
    db.session.commit()
    publish_and_wait(gateway)
    keys = Keys(app.config["REDIS_NAMESPACE"])
    url_to_name = {s.url: f"r{i}" for i, s in enumerate(fake_replicas)}
    rows = {url_to_name[r.url]: r for r in w.pool.replicas}
    views = [ReplicaView(id=r.id) for r in rows.values()]
    probe = _send(w.base_url, w.key, "probe")
    salt = httpx.get(fake_replicas[int(probe[1:])].url + "/stats").json()["last_body"][
        "cache_salt"]
    session = "kv-session-1"
    home = hrw_order(affinity_key(session, None, salt=salt), views)[0].id
    other = next(r for r in rows.values() if r.id != home)
    name_of = {r.id: n for n, r in rows.items()}

    # the blocks the engine would store for this prompt, on the replica rendezvous does
    # NOT pick, as the subscriber writes them
    chain, _ = request_chain(tokens, {"messages": MSGS}, "tiny-served", salt)
    assert len(chain) > 4
    kv_index.apply_events(redis_client, keys, other.id, [("BlockStored", chain)], seq=0)
    kv_index.apply_events(redis_client, keys, home, [], seq=0)
    try:
        def fresh_then(base: str) -> bool:    # the subscriber's heartbeat, while we wait
            kv_index.heartbeat(redis_client, keys, [home, other.id])
            return _send(base, w.key, session) == name_of[other.id]
        # (the gateway loads its tokenizer on first use, falling back meanwhile)
        wait_for(lambda: fresh_then(w.base_url), timeout=60, what="kv_events choice")
        cfg = {"REDIS_URL": app_config["REDIS_URL"],
               "REDIS_NAMESPACE": app_config["REDIS_NAMESPACE"],
               "GATEWAY_SNAPSHOT_POLL_S": 0.1,
               "QDRANT_PATH": str(tmp_path_factory.mktemp("gw2-qdrant")),
               "GATEWAY_LEDGER_SPOOL_DIR": str(tmp_path_factory.mktemp("gw2-spool"))}
        second = Server("gateway", json.dumps(cfg),
                        env={"SLUICE_PROVIDER_KEY_FRONTIER": FRONTIER_KEY},
                        log_dir=tmp_path_factory.mktemp("gw2-logs"))
        try:
            base2 = second.url + "/v1"
            wait_for(lambda: fresh_then(base2), timeout=60,
                     what="second gateway's kv_events choice")
            # the index moves (the blocks now live on the home replica): both follow
            kv_index.forget(redis_client, keys, other.id, resync=True)
            kv_index.apply_events(redis_client, keys, other.id, [], seq=1)
            kv_index.apply_events(redis_client, keys, home, [("BlockStored", chain[:3])],
                                  seq=1)
            for base in (w.base_url, base2, w.base_url, base2):
                assert _send(base, w.key, session) == name_of[home]
            kv_index.apply_events(redis_client, keys, other.id, [("BlockStored", chain)],
                                  seq=2)
            assert {_send(b, w.key, session) for b in (w.base_url, base2)} == {
                name_of[other.id]}
            # stale: no subscriber heartbeat for longer than kv_index.STALE_S -> rendezvous
            for rid in (home, other.id):
                redis_client.hset(keys.replica_kv_state(rid), "seen", 1.0)
            for base in (w.base_url, base2):
                assert _send(base, w.key, session) == name_of[home]
        finally:
            second.stop()
    finally:
        for rid in (home, other.id):
            kv_index.forget(redis_client, keys, rid)
