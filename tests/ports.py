"""Ports for servers a test starts later (engines, pools, private Redis servers).

A port the kernel hands out for ``bind(0)`` comes from its ephemeral range, the same range
every outgoing connection takes its local port from: between the check here and the
server's own bind (seconds, for an engine loading a model) a health probe or a Redis client
can take it, and the server fails with EADDRINUSE (seen: a replica-loss drill's fourth
replica, base port 35769). Ports are chosen below that range instead, at random so that
runs side by side rarely meet, and checked free.
"""
from __future__ import annotations

import random
import socket

_LOW = 20000


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_run(n: int = 1) -> int:
    """A port p with p .. p+n-1 all free on 127.0.0.1, below the ephemeral range."""
    high = _ephemeral_low() - n
    rng = random.SystemRandom()
    if high > _LOW:
        for _ in range(500):
            base = rng.randrange(_LOW, high)
            if all(_free(base + i) for i in range(n)):
                return base
    for _ in range(100):       # a kernel without room below its range: any free run
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if all(_free(base + i) for i in range(1, n)):
            return base
    raise RuntimeError(f"no run of {n} free ports")


def free_port() -> int:
    return free_port_run(1)
