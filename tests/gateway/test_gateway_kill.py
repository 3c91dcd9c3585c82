"""Kill the gateway itself (SIGKILL) while it serves: every request whose client got a
complete answer has exactly one ledger row once the next gateway process on the host has
sent the dead one's spool on; nothing is counted twice."""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import orjson

from tests.gateway.conftest import FRONTIER_KEY, Server, health, make_world, wait_for

N = 40


def _gateway(app_config, spool, log_dir, linger_s: float) -> Server:
    cfg = {"REDIS_URL": app_config["REDIS_URL"], "REDIS_NAMESPACE": app_config["REDIS_NAMESPACE"],
           "GATEWAY_SNAPSHOT_POLL_S": 0.1, "GATEWAY_LEDGER_SPOOL_DIR": str(spool),
           "GATEWAY_LEDGER_LINGER_S": linger_s, "QDRANT_PATH": str(log_dir / "qdrant")}
    return Server("gateway", json.dumps(cfg), env={"SLUICE_PROVIDER_KEY_FRONTIER": FRONTIER_KEY},
                  log_dir=log_dir)


def _call(url: str, key: str, i: int) -> dict:
    """One request; ``complete`` when the client got the whole answer."""
    stream = i % 2 == 0
    body = {"model": "tier-1", "stream": stream, "messages": [
        {"role": "user", "content": f"gateway kill {i} [[chunk-delay:30]] [[delay:{20 * (i % 5)}]]"}]}
    out = {"i": i, "complete": False, "rid": None}
    try:
        with httpx.stream("POST", url, json=body, timeout=30,
                          headers={"authorization": f"Bearer {key}"}) as r:
            out["rid"] = r.headers.get("x-sluice-request-id")
            raw = r.read()
        if r.status_code != 200:
            return out
        if stream:
            events = [e for e in raw.split(b"\n\n") if e]
            out["complete"] = events[-1] == b"data: [DONE]" and not any(
                e.startswith(b'data: {"error"') for e in events)
        else:
            out["complete"] = orjson.loads(raw)["choices"][0]["finish_reason"] == "stop"
    except httpx.HTTPError as exc:
        out["exc"] = repr(exc)
    return out


def test_killed_gateway_loses_no_answered_requests_ledger_row(app, app_config, gateway,
                                                               fake_replicas, frontier, tmp_path):
    world = make_world(app, gateway, [s.url for s in fake_replicas], frontier.url)
    spool = tmp_path / "spool"
    # A long linger keeps every event in the queue (and the spool) until the kill, so the
    # test proves the spool path rather than racing the batch writer.
    victim = _gateway(app_config, spool, tmp_path, linger_s=30.0)
    url = victim.url + "/v1/chat/completions"
    results: list[dict] = []
    lock = threading.Lock()
    killed = threading.Event()

    def job(i: int) -> None:
        res = _call(url, world.key, i)
        with lock:
            results.append(res)
            if sum(r["complete"] for r in results) == N // 2 and not killed.is_set():
                killed.set()
                victim.kill()  # SIGKILL: no shutdown hook runs

    try:
        wait_for(lambda: health(victim)["snapshot_version"], what="victim snapshot")
        with ThreadPoolExecutor(max_workers=6) as pool:
            list(pool.map(job, range(N)))
    finally:
        victim.stop()
    assert killed.is_set(), "the gateway was never killed"
    answered = {r["rid"] for r in results if r["complete"]}
    assert len(answered) >= N // 2
    assert list(spool.glob("ledger-*.spool")), "the killed gateway left no spool"

    heir = _gateway(app_config, spool, tmp_path, linger_s=0.02)
    try:
        recovered = health(heir)["ledger_recovered"]
        assert recovered >= len(answered)
        wait_for(lambda: health(heir)["ledger_written"] >= recovered, what="spool sent on")
    finally:
        heir.stop()
    from app.extensions import db
    from app.ledger.models import LedgerEntry
    from app.ledger.service import drain_stream
    drain_stream(max_batches=50)
    db.session.expire_all()
    rows = list(db.session.scalars(db.select(LedgerEntry).where(
        LedgerEntry.tenant_id == world.tenant.id)))
    ids = [r.request_id for r in rows]
    assert len(ids) == len(set(ids)), "a request was counted twice"
    assert answered <= set(ids), f"answered but unbooked: {answered - set(ids)}"
    assert all(r.status == 200 for r in rows if r.request_id in answered)
    assert not list(spool.glob("ledger-*.spool")), "a clean stop leaves no spool behind"
