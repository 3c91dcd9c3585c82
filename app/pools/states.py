"""Replica lifecycle as an explicit table: event -> (states it may leave, state it enters).

    pending/stopped/down --start--> starting --healthy--> healthy --drain--> draining
    starting/healthy/draining --down--> down --start--> starting   (supervisor restart)
    any --stop--> stopped

The gateway routes only to ``healthy`` replicas (the snapshot carries the state).
"""
from __future__ import annotations

from app.errors import Conflict

TRANSITIONS: dict[str, tuple[frozenset[str], str]] = {
    "start": (frozenset({"pending", "stopped", "down"}), "starting"),
    "healthy": (frozenset({"starting", "down"}), "healthy"),
    "drain": (frozenset({"healthy", "starting"}), "draining"),
    "down": (frozenset({"starting", "healthy", "draining"}), "down"),
    "stop": (frozenset({"pending", "starting", "healthy", "draining", "down", "stopped"}),
             "stopped"),
}
# States in which the supervisor keeps a process running (or brings it back).
SUPERVISED = frozenset({"starting", "healthy", "draining", "down"})
ROUTABLE = frozenset({"healthy"})


def can(event: str, state: str) -> bool:
    return state in TRANSITIONS[event][0]


def next_state(event: str, state: str) -> str:
    allowed, target = TRANSITIONS[event]
    if state not in allowed:
        raise Conflict(f"cannot {event} a replica that is {state}")
    return target
