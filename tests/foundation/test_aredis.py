"""The gateway's asyncio Redis connections pack commands with hiredis: the same bytes and
the same errors as redis-py's own packing, and real round trips (commands, scripts,
pipelines) work through them."""
import asyncio

import pytest
from redis.asyncio.connection import Connection, UnixDomainSocketConnection
from redis.exceptions import DataError

from app.contract import aredis
from app.contract.inflight import Lua
from tests.conftest import REDIS_URL

ARGS = [("SET", "k", 1), ("SET", "k", 1.5), ("SET", "k", 0.1 + 0.2), ("SET", "k", 10**20),
        ("SET", "k", -3), ("SET", "k", 1e300), ("SET", "k", float("inf")),
        ("SET", "ключ", b"\xff\x00"), ("SET", "k", memoryview(b"mv")), ("SET", "k", ""),
        ("SET", "k", bytearray(b"ba")), ("SET", "k\tx", 1), ("CLIENT\tLIST",), (b"SET", "k", 2),
        ("CONFIG GET", "maxmemory"), ("EVALSHA", "ab" * 20, 2, "a", "b", "1.25", b"\x00" * 24)]


def test_packing_is_redis_pys_bytes():
    ours = aredis.packing(Connection)()
    theirs = Connection()
    assert type(ours).pack_command is not Connection.pack_command
    for args in ARGS:
        assert b"".join(ours.pack_command(*args)) == b"".join(theirs.pack_command(*args)), args
    cmds = [("SET", "a", 1), ("GET", "a"), ("EVALSHA", "ab" * 20, 0, "x" * 10_000)]
    assert b"".join(ours.pack_commands(cmds)) == b"".join(theirs.pack_commands(cmds))


@pytest.mark.parametrize("bad", [None, True, object()])
def test_packing_refuses_what_redis_py_refuses(bad):
    with pytest.raises(DataError):
        Connection().pack_command("SET", "k", bad)
    with pytest.raises(DataError):
        aredis.packing(Connection)().pack_command("SET", "k", bad)


def test_classes_are_made_once_and_keep_their_kind():
    tcp = aredis.packing(Connection)
    assert aredis.packing(Connection) is tcp and aredis.packing(tcp) is tcp
    unix = aredis.packing(UnixDomainSocketConnection)
    assert issubclass(unix, UnixDomainSocketConnection) and unix is not tcp
    client = aredis.from_url("unix:///tmp/nowhere.sock")
    assert issubclass(client.connection_pool.connection_class, UnixDomainSocketConnection)


def test_round_trips(redis_namespace):
    async def go():
        client = aredis.from_url(REDIS_URL, socket_timeout=2.0)
        key = f"{redis_namespace}:aredis"
        try:
            await client.set(key, "Grüße \x00 1.5", ex=60)
            assert await client.get(key) == "Grüße \x00 1.5".encode()
            script = Lua("return {KEYS[1], ARGV[1], tonumber(ARGV[2]) * 2}")
            assert await script.acall(client, [key], [b"\xff", 1.25]) == [key.encode(), b"\xff",
                                                                            2]
            pipe = client.pipeline(transaction=False)
            pipe.incrby(key + ":n", 3).incrbyfloat(key + ":f", 0.5).expire(key + ":n", 60)
            pipe.expire(key + ":f", 60)
            assert await pipe.execute() == [3, 0.5, True, True]
            conn = await client.connection_pool.get_connection()
            assert getattr(type(conn), "_hiredis_packing", False)
            await client.connection_pool.release(conn)
        finally:
            await client.delete(key, key + ":n", key + ":f")
            await client.aclose()
    asyncio.run(go())


def test_a_packed_head_gives_the_whole_commands_bytes():
    """A command sent as (head, *rest) is packed as the whole command would be, with or
    without a rest; the head is packed once per distinct leading arguments."""
    ours = aredis.packing(Connection)()
    theirs = Connection()
    full = ("EVALSHA", "ab" * 20, 3, "k:1", "k:2", "ключ", 30, 10.0, b"\x00\xff" * 8, "1.5")
    for cut in (1, 2, 6, 8, len(full)):
        h = aredis.head(full[:cut])
        assert h is aredis.head(tuple(full[:cut])) and h.n == cut
        assert b"".join(ours.pack_command(full[0], h, *full[cut:])) == \
            b"".join(theirs.pack_command(*full)), cut


def test_a_script_with_fixed_arguments_round_trips_and_reloads(redis_namespace):
    async def go():
        client = aredis.from_url(REDIS_URL, socket_timeout=2.0)
        key = f"{redis_namespace}:aredis-head"
        # a text of its own: Redis has never seen it, so the first call is sent again as
        # EVAL (as after a restart or SCRIPT FLUSH, which would hit the other tests too)
        script = Lua(f"-- {key}\nreturn {{KEYS[1], ARGV[1], ARGV[2], ARGV[3]}}")
        try:
            assert aredis.packs_heads(client)
            assert await client.script_exists(script.sha) == [False]
            for n in range(3):
                got = await script.acall(client, [key], [7, f"now-{n}", b"\x00"], fixed=1)
                assert got == [key.encode(), b"7", f"now-{n}".encode(), b"\x00"]
            assert await client.script_exists(script.sha) == [True]
            assert await script.acall(client, [key], [8, "x", b""], fixed=2) == [
                key.encode(), b"8", b"x", b""]
            # a client this module did not make takes the plain EVALSHA
            import redis.asyncio as aioredis
            plain = aioredis.Redis.from_url(REDIS_URL)
            assert not aredis.packs_heads(plain)
            assert await script.acall(plain, [key], [9, "y", b"z"], fixed=1) == [
                key.encode(), b"9", b"y", b"z"]
            await plain.aclose()
        finally:
            await client.aclose()
    asyncio.run(go())
