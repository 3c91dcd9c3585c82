"""Ports for servers a test starts later (engines, pools, private Redis servers).

A port the kernel hands out for ``bind(0)`` comes from its ephemeral range, the same range
every outgoing connection takes its local port from: between the check here and the
server's own bind (seconds, for an engine loading a model) a health probe or a Redis client
can take it, and the server fails with EADDRINUSE (seen: a replica-loss drill's fourth
replica, base port 35769). Ports are chosen below that range instead, at random so that
runs side by side rarely meet, and checked free. A port is handed out once per process (a
fixture that asks for eight before any is bound got the same one twice: the replica-loss
drill's engine then failed with EADDRINUSE on its event port), and each pytest-xdist worker
draws from its own slice of the range, so the suite's two processes never meet.
"""
from __future__ import annotations

import os
import random
import socket

_LOW = 20000
_given: set[int] = set()     # ports this process handed out


def _slice(low: int, high: int) -> tuple[int, int]:
    """This xdist worker's part of [low, high) (``gw<k>`` of PYTEST_XDIST_WORKER_COUNT)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    if not worker.startswith("gw") or count < 2:
        return low, high
    k = int(worker[2:]) % count
    width = (high - low) // count
    return low + k * width, low + (k + 1) * width


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
        low, high = _slice(_LOW, high)
        for _ in range(500):
            base = rng.randrange(low, high)
            run = range(base, base + n)
            if not _given.intersection(run) and all(map(_free, run)):
                _given.update(run)
                return base
    for _ in range(100):       # a kernel without room below its range: any free run
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base not in _given and all(_free(base + i) for i in range(1, n)):
            _given.update(range(base, base + n))
            return base
    raise RuntimeError(f"no run of {n} free ports")


def free_port() -> int:
    return free_port_run(1)


_held: list[socket.socket] = []   # dead_port's sockets, open for the life of the process


def dead_port() -> int:
    """A port nothing will ever answer on: bound (never listening) by a socket this
    process keeps open, so a connection to it is refused and no server can take it. A
    port found free and closed again (``bind(0)``, then close) is back in the ephemeral
    range: a server the other xdist worker started on a port the OS picked took one, and
    a request to the "dead" replica was answered by that worker's fake replica."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    _held.append(s)
    return s.getsockname()[1]
