"""A Redis outage costs the cache (almost) nothing per request: after one failed call the
store skips Redis for a pause, then tries again and recovers by itself."""
import socket
import threading

import numpy as np
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from app.contract.cache.keys import build_key
from app.contract.cache.store import CacheStore
from app.contract.policy import DEFAULTS
from tests.gateway.conftest import wait_for
from tests.gateway.test_redis_outage import start_redis

TH = DEFAULTS["cache_similarity_threshold"]
ANSWER = {"choices": [{"index": 0, "finish_reason": "stop",
                       "message": {"role": "assistant", "content": "ok"}}]}


class HangUpServer:
    """Accepts TCP connections and closes them at once, counting them: a broken Redis."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture()
def hangup():
    srv = HangUpServer()
    yield srv
    srv.close()


def client(port: int) -> redis.Redis:
    """Configured like the gateway's cache client: no retries."""
    return redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1,
                       retry=Retry(NoBackoff(), 0))


def key_and_vec(text="Warranty for SKU-7 in Ohio"):
    key = build_key("t1", DEFAULTS, "auto", {"temperature": 0,
                                              "messages": [{"role": "user", "content": text}]})
    vec = np.ones(384, dtype=np.float32) / np.sqrt(384)
    return key, vec


def test_open_breaker_leaves_a_broken_redis_alone(hangup):
    store = CacheStore(client(hangup.port), "breaker", breaker_s=600)
    key, vec = key_and_vec()
    assert store.lookup(key, vec, TH) is None
    tried = hangup.accepted
    assert tried >= 1 and not store.redis_available()
    for _ in range(20):
        assert store.lookup(key, vec, TH) is None
        assert store.store(key, vec, ANSWER, "r1", 60) is False
    assert store.evict("r1") is False
    assert hangup.accepted == tried  # not one more connection while the breaker is open


def test_without_a_pause_every_call_tries_redis(hangup):
    store = CacheStore(client(hangup.port), "breaker", breaker_s=0)
    key, vec = key_and_vec()
    for _ in range(3):
        assert store.lookup(key, vec, TH) is None
    assert hangup.accepted >= 3


def test_breaker_closes_when_redis_comes_back(tmp_path, closed_port):
    store = CacheStore(client(closed_port), "breaker", breaker_s=0.2)
    key, vec = key_and_vec()
    assert store.store(key, vec, ANSWER, "r1", 60) is False  # Redis is not there yet
    assert not store.redis_available()
    proc = start_redis(closed_port, tmp_path)
    try:
        wait_for(store.redis_available, what="breaker pause to end")
        assert store.store(key, vec, ANSWER, "r1", 60) is True
        assert store.lookup(key, vec, TH).kind == "exact"
        assert store.redis_available()
    finally:
        proc.kill()
        proc.wait(10)
