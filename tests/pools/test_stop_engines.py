"""`flask sluice stop-engines` (what run.sh calls on Ctrl-C after stopping the worker):
every engine process this node started is ended, directly, and its replica is stopped."""
from __future__ import annotations

import uuid

from app.catalog.models import Replica
from app.catalog.service import sync_replica_rows
from app.extensions import db
from tests.factories import PoolFactory
from tests.pools.conftest import free_port_pair
from workers.pools import driver, launcher


def test_stop_engines_ends_every_engine_of_the_node(app, tiny_model_dir):
    node = f"stopnode{uuid.uuid4().hex[:6]}"
    pool = PoolFactory(name=f"stop-{node}", engine="reference", model=str(tiny_model_dir),
                       served_model_name="tiny", desired_replicas=2, base_port=free_port_pair(),
                       node=node, options={"threads": 1})
    other = PoolFactory(name=f"keep-{node}", engine="reference", model=str(tiny_model_dir),
                        desired_replicas=1, base_port=free_port_pair(), node=node + "x",
                        options={"threads": 1})
    sync_replica_rows(pool)
    sync_replica_rows(other)
    db.session.commit()
    pids = []
    try:
        for r in [*pool.replicas, *other.replicas]:
            assert driver.start_replica(r.id, wait_s=120) == "healthy"
        db.session.expire_all()
        pids = {r.id: r.pid for r in db.session.scalars(db.select(Replica))}
        out = app.test_cli_runner().invoke(args=["sluice", "stop-engines", "--node", node])
        assert out.exit_code == 0 and "2 engine replica(s) stopped" in out.output
        db.session.expire_all()
        for r in pool.replicas:
            assert r.state == "stopped" and r.pid is None
            assert not launcher.is_running(pids[r.id])
        (kept,) = other.replicas
        assert kept.state == "healthy" and launcher.is_running(pids[kept.id])   # not this node
    finally:
        for pid in pids.values() if isinstance(pids, dict) else pids:
            launcher.terminate(pid, grace_s=5)
