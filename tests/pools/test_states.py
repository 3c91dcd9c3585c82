"""The replica lifecycle table."""
from __future__ import annotations

import pytest

from app.catalog.models import REPLICA_STATES
from app.errors import Conflict
from app.pools import states


def test_every_state_the_table_names_exists_and_stop_is_always_allowed():
    for allowed, target in states.TRANSITIONS.values():
        assert target in REPLICA_STATES and allowed <= set(REPLICA_STATES)
    assert all(states.can("stop", s) for s in REPLICA_STATES)


def test_supervisor_cycle_and_refusals():
    s = "pending"
    for event in ("start", "healthy", "down", "start", "healthy", "drain", "stop"):
        s = states.next_state(event, s)
    assert s == "stopped"
    with pytest.raises(Conflict):
        states.next_state("drain", "stopped")
    with pytest.raises(Conflict):
        states.next_state("healthy", "stopped")
    assert states.ROUTABLE == {"healthy"}
