"""The gateway's ``redis.asyncio`` connections, with commands packed by hiredis.

redis-py's asyncio ``Connection`` packs every command in Python (an encode and a header
per argument), while its sync one packs through ``hiredis.pack_command`` when hiredis is
installed. On the gateway's hot path (S03's route script: 20 keys and 4 arguments per
request; the in-flight acquire and release) that Python packing was 8-12 us of a ~80 us
call; hiredis packs the same bytes in 3-4 us (checked equal, errors included, in
tests/foundation/test_aredis.py). ``pack_commands`` (pipelines) calls ``pack_command``, so
pipelines take it too. Without hiredis the connection classes are redis-py's own.
"""
from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.connection import HiredisRespSerializer

try:
    import hiredis  # noqa: F401 - only whether it is there
    _PACKER: HiredisRespSerializer | None = HiredisRespSerializer()
except ImportError:   # pragma: no cover - hiredis is a dependency; redis-py's packing then
    _PACKER = None

_CLASSES: dict[type, type] = {}


def packing(cls: type) -> type:
    """``cls`` (a redis.asyncio connection class: TCP, unix socket, TLS) whose
    ``pack_command`` is hiredis's."""
    if _PACKER is None or getattr(cls, "_hiredis_packing", False):
        return cls
    got = _CLASSES.get(cls)
    if got is None:
        def pack_command(self, *args: Any) -> list[bytes]:
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
