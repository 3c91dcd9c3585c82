"""Tool retrieval's workflow memory shared through Redis (``SharedWorkflowMemory``): what
one gateway process learns the others read, a restart forgets nothing, and Redis out
leaves each process its own memory. Real Redis; two instances stand for two processes."""
from __future__ import annotations

import logging
import socket
import time
import uuid

import numpy as np
import pytest

from app.contract.keys import Keys
from app.core.tool_select import co_called_counts
from app.gateway.workflow_memory import MEMORY_TTL_S, SharedWorkflowMemory, memory_client
from tests.conftest import REDIS_URL
from tests.ports import dead_port


def unit(*xs: float) -> np.ndarray:
    v = np.array(xs, dtype=np.float32)
    return v / np.linalg.norm(v)


@pytest.fixture()
def keys(redis_namespace) -> Keys:
    return Keys(redis_namespace)


@pytest.fixture()
def key() -> tuple:
    return (f"tenant-{uuid.uuid4().hex[:8]}", "wf-signature")


def process(keys: Keys, size: int = 512) -> SharedWorkflowMemory:
    """The memory one gateway process holds."""
    return SharedWorkflowMemory(memory_client(REDIS_URL), keys, size=size)


def called(entries: list) -> list[tuple[str, ...]]:
    return [c for _, c in entries]


def test_what_one_process_learns_the_other_reads_and_a_restart_keeps(keys, key):
    a, b = process(keys), process(keys)
    assert b.entries(key) == []
    a.learn(key, "book a flight", unit(1, 0), ["search_flights"])
    a.learn(key, "fly to Rome", unit(0.8, 0.6), ["search_flights", "book_flight"])
    a.learn(key, "just chatting", unit(0, 1), [])   # nothing called: nothing learned
    got = b.entries(key)
    assert called(got) == [("search_flights",), ("search_flights", "book_flight")]
    assert np.allclose(got[1][0], unit(0.8, 0.6)) and got[1][0].dtype == np.float32
    assert called(b.entries(key, other_than="fly to Rome")) == [("search_flights",)]
    assert co_called_counts(b.entries(key)) == {"search_flights": {"book_flight": 1},
                                                "book_flight": {"search_flights": 1}}
    b.learn(key, "cheapest flight to Oslo", unit(0.9, 0.1), ["search_flights"])
    assert len(a.entries(key)) == 3   # both ways
    restarted = process(keys)
    assert called(restarted.entries(key)) == called(a.entries(key)) == called(b.entries(key))
    assert restarted.entries(("another tenant", key[1])) == []
    # Redis keeps a digest of the user turns, never their text
    stored = a.redis.xrange(keys.tool_memory(*key))
    assert len(stored) == 3 and all(len(f[b"q"]) == 32 for _, f in stored)
    assert not any(b"Rome" in f[b"q"] or b"flight" in f[b"q"] for _, f in stored)


def test_the_same_question_learned_again_replaces_the_older(keys, key):
    a, b = process(keys), process(keys)
    a.learn(key, "fly to Rome", unit(1, 0), ["search_flights"])
    b.learn(key, "weather in Oslo", unit(0, 1), ["get_weather"])
    a.learn(key, "fly to Rome", unit(1, 0), ["search_flights", "book_flight"])
    for mem in (a, b, process(keys)):
        assert called(mem.entries(key)) == [("get_weather",),
                                            ("search_flights", "book_flight")]


def test_at_most_size_conversations_are_kept_and_the_stream_is_trimmed(keys, key):
    a = process(keys, size=5)
    for i in range(300):
        a.learn(key, f"question {i}", unit(1, i), [f"tool_{i}"])
    want = [(f"tool_{i}",) for i in range(295, 300)]
    assert called(a.entries(key)) == want
    assert called(process(keys, size=5).entries(key)) == want
    # trimmed approximately (whole stream nodes of 100 entries), never unbounded
    assert a.redis.xlen(keys.tool_memory(*key)) <= 5 + 100


def test_a_workflows_memory_expires_when_it_goes_quiet(keys, key):
    a = process(keys)
    a.learn(key, "fly to Rome", unit(1, 0), ["search_flights"])
    name = keys.tool_memory(*key)
    assert name.startswith(keys.ns + ":")
    a.redis.expire(name, 60)
    a.learn(key, "weather in Oslo", unit(0, 1), ["get_weather"])   # a write sets it again
    assert MEMORY_TTL_S - 60 < a.redis.ttl(name) <= MEMORY_TTL_S


def closed_port() -> int:
    return dead_port()


TOOLS = [{"type": "function", "function": {"name": n, "description": d}}
         for n, d in [("search_flights", "Search airline flights"),
                      ("get_weather", "Weather forecast for a city"),
                      ("play_music", "Play a song"), ("calculate", "Do arithmetic")]]


def test_redis_unreachable_leaves_the_process_its_own_memory(keys, key, caplog):
    from app.contract.cache.embedding import embed
    from app.gateway.tool_retrieval import select_for
    down = SharedWorkflowMemory(memory_client(f"redis://127.0.0.1:{closed_port()}/0"), keys)
    caplog.set_level(logging.DEBUG, logger="app.gateway.workflow_memory")
    down.learn(key, "Plan my trip to Rome", embed("Plan my trip to Rome"), ["play_music"])
    assert called(down.entries(key)) == [("play_music",)]
    query = "Plan my trip to Rome, please"
    sel = select_for(TOOLS, [{"role": "user", "content": query}], "auto", k=1, pinned=[],
                     qvec=embed(query), query=query, key=key, memory=down)
    assert sel.reasons["play_music"] == "learned"   # from this process's memory
    failures = [r for r in caplog.records if "Redis unreachable" in r.getMessage()]
    assert len(failures) == 1 and failures[0].levelno == logging.DEBUG   # once per burst


def test_redis_silent_costs_a_request_one_short_timeout_then_nothing(keys, key):
    from app.gateway.workflow_memory import REDIS_TIMEOUT_S
    with socket.socket() as silent:   # accepts connections (the kernel does), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        slow = SharedWorkflowMemory(
            memory_client(f"redis://127.0.0.1:{silent.getsockname()[1]}/0"), keys)
        t0 = time.perf_counter()
        slow.learn(key, "fly to Rome", unit(1, 0), ["search_flights"])
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(10):   # Redis is skipped for a while: no request waits again
            slow.learn(key, "fly to Oslo", unit(0, 1), ["search_flights"])
            assert len(slow.entries(key)) == 2
        after = time.perf_counter() - t0
    assert REDIS_TIMEOUT_S <= first < REDIS_TIMEOUT_S + 0.5
    assert after < 0.05
