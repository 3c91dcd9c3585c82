"""Kill an upstream replica mid-run: requests that had not started yet succeed on the
other replica, and the ledger holds exactly one row per request, 200 for each success."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import orjson
import pytest

from tests.gateway.conftest import Server, make_world

N = 24


@pytest.fixture()
def two_replicas(tmp_path):
    servers = [Server("fake", name, log_dir=tmp_path) for name in ("A", "B")]
    yield servers
    for s in servers:
        s.stop()


def stream_once(world, i: int) -> dict:
    body = {"model": "tier-1", "stream": True, "messages": [
        {"role": "system", "content": f"kill suite prompt {i}"},
        {"role": "user", "content": f"one two three four five six [[chunk-delay:40]] q{i}"}]}
    started = time.monotonic()
    out = {"i": i, "started": started, "ok": False, "replica": None}
    try:
        with httpx.stream("POST", world.base_url + "/chat/completions", json=body, timeout=30,
                          headers={"authorization": f"Bearer {world.key}"}) as r:
            out["replica"] = r.headers.get("x-fake-replica")
            out["status"] = r.status_code
            raw = r.read()
    except httpx.HTTPError as exc:
        out["exc"] = repr(exc)
        return out
    events = [e for e in raw.split(b"\n\n") if e]
    errors = [e for e in events if e.startswith(b'data: {"error"')]
    text = "".join((orjson.loads(e[6:])["choices"] or [{}])[0].get("delta", {}).get("content")
                   or "" for e in events[:-1] if not e.startswith(b'data: {"error"'))
    out["ok"] = (out["status"] == 200 and events[-1] == b"data: [DONE]" and not errors
                 and text == f"Echo: one two three four five six q{i}")
    out["errored_cleanly"] = bool(errors) and events[-1] == b"data: [DONE]"
    return out


def test_killing_a_replica_mid_run(app, gateway, frontier, two_replicas):
    a, b = two_replicas
    world = make_world(app, gateway, [a.url, b.url], frontier.url)
    done: list[dict] = []
    lock = threading.Lock()
    killed_at: list[float] = []

    def job(i: int) -> None:
        res = stream_once(world, i)
        with lock:
            done.append(res)
            if len(done) == 8 and not killed_at:
                a.kill()
                killed_at.append(time.monotonic())

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(job, range(N)))

    assert killed_at, "replica A was never killed"
    before = [r for r in done if r["started"] < killed_at[0]]
    after = [r for r in done if r["started"] > killed_at[0]]
    assert any(r["replica"] == "A" for r in before), "A served nothing before the kill"
    assert after and all(r["ok"] for r in after), [r for r in after if not r["ok"]]
    assert all(r["replica"] == "B" for r in after)
    # anything that did not succeed ended with an error event + [DONE], never a silent cut
    assert all(r["ok"] or r.get("errored_cleanly") for r in done), done
    successes = sum(r["ok"] for r in done)
    rows = world.drain_rows(N)
    assert len(rows) == N and len({r.request_id for r in rows}) == N
    assert sum(r.status == 200 for r in rows) == successes
