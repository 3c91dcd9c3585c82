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


def packing(cls: type) -> type:
    """``cls`` (a redis.asyncio connection class: TCP, unix socket, TLS) whose
    ``pack_command`` is hiredis's."""
    if _PACKER is None or getattr(cls, "_hiredis_packing", False):
        return cls
    got = _CLASSES.get(cls)
    if got is None:
        def pack_command(self, *args: Any) -> list[bytes]:
            name = args[0]
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


def fast(pool: aioredis.ConnectionPool) -> aioredis.ConnectionPool:
    """``pool`` making its connections with hiredis packing (before it made any)."""
    pool.connection_class = packing(pool.connection_class)
    return pool


def from_url(url: str, **kwargs: Any) -> aioredis.Redis:
    """``redis.asyncio.Redis.from_url`` with hiredis packing (the URL still picks TCP,
    unix socket or TLS)."""
    client = aioredis.Redis.from_url(url, **kwargs)
    fast(client.connection_pool)
    return client
