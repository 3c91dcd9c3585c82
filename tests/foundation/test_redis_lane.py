"""The gateway's pipelined Redis lane (``app.contract.redis_lane``) against the real Redis:
replies reach their own callers under concurrency, errors and a lost script are what
redis-py raised, a cancelled caller does not shift the others' replies, a killed connection
fails its waiting calls and the next call connects again, a Redis that stops answering
times out, and the URL's database and socket are kept."""
import asyncio
import shutil
import subprocess
import time

import pytest
import redis
from redis.exceptions import ConnectionError, NoScriptError, ResponseError, TimeoutError

from app.contract import aredis
from app.contract.inflight import Lua
from app.contract.redis_lane import Lane, lane_for
from tests.conftest import REDIS_URL

ECHO = Lua("return {KEYS[1], ARGV[1]}")


def _client(**kw):
    client = aredis.from_url(REDIS_URL, socket_timeout=2.0, **kw)
    assert aredis.lane_of(client) is not None
    return client


def test_concurrent_calls_each_get_their_own_reply(redis_namespace):
    async def go():
        client = _client()
        lane = aredis.lane_of(client)

        async def one(i):
            return await ECHO.acall(client, [f"{redis_namespace}:{i}"], [i])
        got = await asyncio.gather(*(one(i) for i in range(600)))
        assert got == [[f"{redis_namespace}:{i}".encode(), str(i).encode()]
                       for i in range(600)]
        assert lane.connects == 1        # one connection carried them all
        lane.close()
        await client.aclose()
    asyncio.run(go())


def test_fixed_arguments_pack_the_same_command(redis_namespace):
    async def go():
        client = _client()
        script = Lua("return {KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3]}")
        keys = [f"{redis_namespace}:a", f"{redis_namespace}:b"]
        for fixed in (0, 1, 2, 3):
            assert await script.acall(client, keys, [7, 1.25, b"\xff"], fixed=fixed) == \
                [k.encode() for k in keys] + [b"7", b"1.25", b"\xff"]
        aredis.lane_of(client).close()
        await client.aclose()
    asyncio.run(go())


def test_error_replies_raise_redis_pys_errors_and_the_lane_goes_on(redis_namespace):
    async def go():
        client = _client()
        lane = aredis.lane_of(client)
        with pytest.raises(ResponseError, match="boom"):
            await Lua("return redis.error_reply('boom')").acall(client, [], [])
        with pytest.raises(NoScriptError):
            await lane.execute(aredis.packed(("EVALSHA", "0" * 40, 0)))
        # a script Redis has not seen: EVALSHA misses, the text goes once, then by sha
        fresh = Lua(f"return '{redis_namespace}'")
        assert await fresh.acall(client, [], []) == redis_namespace.encode()
        assert await lane.execute(aredis.packed(("EVALSHA", fresh.sha, 0))) == \
            redis_namespace.encode()
        assert await ECHO.acall(client, ["k"], [1]) == [b"k", b"1"]
        assert lane.connects == 1
        lane.close()
        await client.aclose()
    asyncio.run(go())


def test_a_cancelled_caller_leaves_the_others_replies_in_place(redis_namespace):
    slow = Lua("local t = redis.call('TIME') local s = t[1] * 1e6 + t[2] "
               "repeat t = redis.call('TIME') until t[1] * 1e6 + t[2] - s > 50000 "
               "return 'slow'")

    async def go():
        client = _client()
        first = asyncio.ensure_future(slow.acall(client, [], []))
        await asyncio.sleep(0.01)
        after = asyncio.ensure_future(ECHO.acall(client, ["after"], [2]))
        first.cancel()
        assert await after == [b"after", b"2"]
        assert first.cancelled()
        assert await ECHO.acall(client, ["next"], [3]) == [b"next", b"3"]
        aredis.lane_of(client).close()
        await client.aclose()
    asyncio.run(go())


def test_a_killed_connection_fails_its_calls_and_the_next_call_connects_again(
        redis_namespace):
    name = f"{redis_namespace}-lane"

    async def go():
        client = _client()
        lane = aredis.lane_of(client)
        await lane.execute(aredis.packed(("CLIENT", "SETNAME", name)))
        sync = redis.Redis.from_url(REDIS_URL)
        blocked = asyncio.ensure_future(lane.execute(aredis.packed(
            ("BLPOP", f"{redis_namespace}:never", 5))))
        await asyncio.sleep(0.05)
        killed = [c for c in sync.client_list() if c.get("name") == name]
        assert len(killed) == 1
        sync.client_kill_filter(_id=killed[0]["id"])
        with pytest.raises(ConnectionError):
            await blocked
        assert await ECHO.acall(client, ["again"], [1]) == [b"again", b"1"]
        assert lane.connects == 2
        lane.close()
        await client.aclose()
    asyncio.run(go())


def test_a_redis_that_stops_answering_times_out_and_the_lane_reconnects():
    accepted = []

    async def go():
        async def mute(reader, writer):           # reads, never answers
            accepted.append(writer)
            await reader.read(1 << 16)
            await asyncio.sleep(30)
        server = await asyncio.start_server(mute, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        lane = Lane(("127.0.0.1", port), timeout_s=0.3)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            await lane.execute(aredis.packed(("PING",)))
        waited = time.monotonic() - t0
        assert 0.3 <= waited        # the watchdog's first look finds no reply: at most 2 looks
        with pytest.raises(TimeoutError):
            await lane.execute(aredis.packed(("PING",)))
        assert lane.connects == 2 and len(accepted) == 2
        lane.close()
        server.close()
    asyncio.run(go())


def test_a_refused_connection_is_a_connection_error():
    async def go():
        lane = Lane(("127.0.0.1", 9), timeout_s=0.5)
        with pytest.raises(ConnectionError):
            await lane.execute(aredis.packed(("PING",)))
    asyncio.run(go())


def test_the_urls_database_is_selected(redis_namespace):
    key = f"{redis_namespace}:db"

    async def go():
        client = aredis.from_url(REDIS_URL.rsplit("/", 1)[0] + "/3", socket_timeout=2.0)
        await Lua("return redis.call('SET', KEYS[1], 'in 3', 'EX', 60)").acall(client, [key],
                                                                             [])
        aredis.lane_of(client).close()
        await client.aclose()
    asyncio.run(go())
    base = REDIS_URL.rsplit("/", 1)[0]
    assert redis.Redis.from_url(base + "/3").get(key) == b"in 3"
    assert redis.Redis.from_url(base + "/0").get(key) is None
    redis.Redis.from_url(base + "/3").delete(key)


def test_one_lane_serves_successive_event_loops(redis_namespace):
    client = _client()
    for i in range(3):
        assert asyncio.run(ECHO.acall(client, ["loop"], [i])) == [b"loop", str(i).encode()]
    assert aredis.lane_of(client).connects == 3


def test_which_clients_get_a_lane():
    assert lane_for(aredis.from_url("unix:///tmp/sluice.sock", lane=False)).address == \
        "/tmp/sluice.sock"
    assert aredis.lane_of(aredis.from_url("rediss://127.0.0.1:6380/0")) is None
    assert aredis.lane_of(aredis.from_url(REDIS_URL, decode_responses=True)) is None
    assert aredis.lane_of(aredis.from_url(REDIS_URL, lane=False)) is None
    lane = lane_for(aredis.from_url("redis://u:secret@127.0.0.1:6390/2", lane=False))
    assert lane.address == ("127.0.0.1", 6390)
    assert lane.prelude == [aredis.packed(("AUTH", "u", "secret")),
                            aredis.packed(("SELECT", 2))]


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server here")
def test_a_unix_socket_with_a_password(tmp_path):
    """A private redis-server on a unix socket only, with a password: the lane sends the
    URL's AUTH and SELECT before the first call, on every connection."""
    sock = tmp_path / "r.sock"
    proc = subprocess.Popen(["redis-server", "--port", "0", "--unixsocket", str(sock),
                             "--requirepass", "s3cret", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if sock.exists():
                break
            time.sleep(0.05)
        url = f"unix://:s3cret@{sock}?db=2"

        async def go():
            client = aredis.from_url(url, socket_timeout=2.0)
            lane = aredis.lane_of(client)
            assert lane.address == str(sock)
            assert await ECHO.acall(client, ["u"], [1]) == [b"u", b"1"]
            assert await Lua("return redis.call('SET', KEYS[1], 'x')").acall(client, ["k"], []) \
                == b"OK"
            lane.close()
            await client.aclose()
        asyncio.run(go())
        direct = redis.Redis(unix_socket_path=str(sock), password="s3cret", db=2)
        assert direct.get("k") == b"x"
        assert redis.Redis(unix_socket_path=str(sock), password="s3cret", db=0).get("k") is None

        async def wrong():
            client = aredis.from_url(f"unix://:wrong@{sock}", socket_timeout=2.0)
            with pytest.raises(redis.exceptions.AuthenticationError):
                await ECHO.acall(client, ["u"], [1])
        asyncio.run(wrong())
    finally:
        proc.terminate()
        proc.wait(timeout=10)
