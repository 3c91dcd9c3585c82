"""The supervisor restarts a dead replica with exponential backoff (base x 2^failures,
capped), and waits out the backoff instead of restarting at every pass."""
from __future__ import annotations

import time

import pytest

from app.catalog.models import Pool, Replica
from app.extensions import db
from workers.pools import driver
from tests.gateway.conftest import wait_for
from tests.pools.conftest import free_port_pair


@pytest.fixture()
def broken_replica(app, tmp_path):
    """A reference replica whose model does not exist: every start dies at once."""
    saved = {k: app.config.get(k) for k in ("POOLS_BACKOFF_BASE_S", "POOLS_BACKOFF_MAX_S",
                                            "POOLS_VAR_DIR")}
    app.config.update(POOLS_BACKOFF_BASE_S=10.0, POOLS_BACKOFF_MAX_S=35.0,
                      POOLS_VAR_DIR=str(tmp_path))
    pool = Pool(name="broken", node="local", engine="reference", model=str(tmp_path / "none"),
                served_model_name="broken", desired_replicas=1, base_port=free_port_pair(),
                options={})
    db.session.add(pool)
    db.session.flush()
    replica = Replica(pool_id=pool.id, index=0, url="http://127.0.0.1:1", state="healthy")
    db.session.add(replica)
    db.session.commit()
    yield replica
    db.session.refresh(replica)
    from workers.pools import launcher
    launcher.terminate(replica.pid)
    app.config.update(saved)


_last_pass_started = [0.0]


def _pass(rid: int) -> str:
    _last_pass_started[0] = time.time()
    return driver.supervise_replica(rid)


def _next_restart_in(replica_id: int, t0: float) -> float:
    return driver._memory(replica_id)["next_restart"] - t0


def test_backoff_doubles_per_failure_and_is_capped(app, broken_replica):
    rid = broken_replica.id
    gaps = []
    for attempt in range(4):
        if attempt:
            driver._remember(rid, next_restart=0)  # the backoff has passed
            assert driver.supervise_replica(rid) == "restarted"
            # the engine serves /health at once and reports the failed model load there
            wait_for(lambda: _pass(rid) != "starting", timeout=180, what="the start to fail")
            t0 = _last_pass_started[0]
        else:
            t0 = time.time()
            assert driver.supervise_replica(rid) == "down"
        assert driver._memory(rid)["failures"] == attempt + 1
        gaps.append(_next_restart_in(rid, t0))
        # while the backoff runs, passes wait instead of restarting
        assert driver.supervise_replica(rid) == "waiting"
    db.session.refresh(broken_replica)
    assert broken_replica.state == "down" and broken_replica.restarts == 3
    # 10 s, 20 s, 35 s (cap), 35 s: each gap is measured from just before its pass
    for gap, want in zip(gaps, (10, 20, 35, 35)):
        assert want - 0.5 <= gap <= want + 5, gaps
