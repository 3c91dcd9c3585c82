"""The gateway's ``redis.asyncio`` connections, with commands packed by hiredis.

redis-py's asyncio ``Connection`` packs every command in Python (an encode and a header
per argument), while its sync one packs through ``hiredis.pack_command`` when hiredis is
installed. On the gateway's hot path (S03's route script: 20 keys and 4 arguments per
request; the in-flight acquire and release) that Python packing was 8-12 us of a ~80 us
call; hiredis packs the same bytes in 3-4 us (checked equal, errors included, in
tests/foundation/test_aredis.py). ``pack_commands`` (pipelines) calls ``pack_command``, so
pipelines take it too. Without hiredis the connection classes are redis-py's own.

A command whose name is one word goes to ``hiredis.pack_command`` as it is: redis-py's
hiredis packer first copies the arguments through a generator that turns bytearrays and
memoryviews into bytes, which cost more than the packing (4.4 of 7.3 us for the route
script's 29 arguments). hiredis takes memoryviews itself; anything it refuses (a bytearray,
None, a bool) goes through redis-py's packer, which converts it or raises its DataError.

A script call's keys and leading fixed arguments are the same on every call from a call
site (S03's route script: EVALSHA, its sha, 20 key names and 3 settings of 31 arguments),
and hiredis formats each argument's header with a ``sprintf`` (about 1,100 instructions
apiece, callgrind). ``head`` packs them once into a ``Head``, kept per (script, keys,
fixed arguments); a command sent as ``(name, head, *rest)`` packs only ``rest`` and joins
it behind the head (``app.contract.inflight.Lua.acall``). The name stays first and a str,
as redis-py reads it (response callbacks, a case-insensitive lookup).
"""
from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.connection import HiredisRespSerializer

try:
    from hiredis import pack_command as _pack
    _PACKER: HiredisRespSerializer | None = HiredisRespSerializer()
except ImportError:   # pragma: no cover - hiredis is a dependency; redis-py's packing then
    _PACKER = None

_ONE_WORD: dict[str, bool] = {}     # command name -> no whitespace in it (redis-py splits it)

_CLASSES: dict[type, type] = {}


class Head(bytes):
    """Leading arguments of a command (its name included) packed as RESP bulk strings
    (no array header); ``n``: how many. Sent second, after the name it holds."""
    n: int


_HEADS: dict[tuple, Head] = {}


def head(args: tuple) -> Head:
    """``args`` packed once per process (the last 1024 kept); ``args`` must hash (names,
    numbers, bytes)."""
    got = _HEADS.get(args)
    if got is None:
        packed = _pack(args)
        got = Head(packed[packed.index(b"\r\n") + 2:])
        got.n = len(args)
        if len(_HEADS) >= 1024:
            _HEADS.clear()
        _HEADS[args] = got
    return got


def packs_heads(client: Any) -> bool:
    """Whether ``client``'s connections take a ``Head`` (this module made them)."""
    return getattr(client, "_sluice_heads", False)


def packing(cls: type) -> type:
    """``cls`` (a redis.asyncio connection class: TCP, unix socket, TLS) whose
    ``pack_command`` is hiredis's."""
    if _PACKER is None or getattr(cls, "_hiredis_packing", False):
        return cls
    got = _CLASSES.get(cls)
    if got is None:
        def pack_command(self, *args: Any) -> list[bytes]:
            name = args[0]
            if len(args) > 1 and args[1].__class__ is Head:   # (name, head, *rest)
                return [packed(args)]        # the head packed already, the name with it
            if name.__class__ is str:
                one = _ONE_WORD.get(name)
                if one is None:
                    one = len(name.split()) == 1
                    if len(_ONE_WORD) < 1024:
                        _ONE_WORD[name] = one
                if one:
                    try:
                        return [_pack(args)]
                    except TypeError:    # redis-py's packer converts it or says why not
                        pass
            return _PACKER.pack(*args)
        got = _CLASSES[cls] = type(f"Hiredis{cls.__name__}", (cls,),
                                   {"pack_command": pack_command, "_hiredis_packing": True})
    return got


def packed(args: tuple) -> bytes:
    """``args`` as one RESP command, as the connections above pack it (a ``Head`` second
    taken as it is): for ``app.contract.redis_lane``, which writes bytes."""
    if len(args) > 1 and args[1].__class__ is Head:
        h = args[1]
        if len(args) == 2:
            return b"*%d\r\n%b" % (h.n, h)
        rest = _pack(args[2:])
        return b"*%d\r\n%b%b" % (h.n + len(args) - 2, h, rest[rest.index(b"\r\n") + 2:])
    try:
        return _pack(args)
    except TypeError:            # redis-py's packer converts it or says why not
        return b"".join(_PACKER.pack(*args))


def fast(pool: aioredis.ConnectionPool) -> aioredis.ConnectionPool:
    """``pool`` making its connections with hiredis packing (before it made any)."""
    pool.connection_class = packing(pool.connection_class)
    return pool


def from_url(url: str, *, lane: bool = True, **kwargs: Any) -> aioredis.Redis:
    """``redis.asyncio.Redis.from_url`` with hiredis packing (the URL still picks TCP,
    unix socket or TLS) and, with ``lane``, a pipelined connection beside its pool for
    script calls (``app.contract.redis_lane``; ``app.contract.inflight.Lua.acall`` takes
    it)."""
    client = aioredis.Redis.from_url(url, **kwargs)
    fast(client.connection_pool)
    client._sluice_heads = _PACKER is not None
    if _PACKER is not None and lane:
        from app.contract.redis_lane import lane_for
        client._sluice_lane = lane_for(client)
    return client


def lane_of(client: Any):
    """The ``app.contract.redis_lane.Lane`` ``from_url`` gave ``client``, if any."""
    return getattr(client, "_sluice_lane", None)
