import socket
import uuid

import pytest

from app.contract.cache.store import CacheStore


@pytest.fixture(scope="session")
def raw_redis():
    """A plain client: the store tests need Redis, not the Flask app."""
    import redis

    from tests.conftest import REDIS_URL
    client = redis.Redis.from_url(REDIS_URL, socket_timeout=2)
    yield client
    client.close()


@pytest.fixture()
def store(raw_redis, redis_namespace, tmp_path):
    s = CacheStore(raw_redis, f"{redis_namespace}:c{uuid.uuid4().hex[:8]}",
                   qdrant_path=str(tmp_path / "qdrant"))
    yield s
    s.invalidate()
    s.close()


@pytest.fixture(scope="session")
def closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens here any more
    return port
