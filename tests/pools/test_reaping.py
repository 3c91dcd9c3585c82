"""An engine whose supervisor died is reaped at the next start by its recorded pid and
start time (``app.core.procs``), never by name: a recorded pid the kernel has since given
to another process is left alone; stopping an engine ends its whole process group."""
from __future__ import annotations

import subprocess
import sys
import time
import uuid

from app.catalog.models import Replica
from app.catalog.service import sync_replica_rows
from app.core import procs
from app.extensions import db
from tests.factories import PoolFactory
from tests.pools.conftest import free_port_pair
from workers.pools import driver, launcher


def _spawn_sleeper(tmp_path, name: str, script: str = "sleep 300") -> tuple[int, launcher.ReplicaPaths]:
    paths = launcher.replica_paths(tmp_path, name)
    pid = launcher.spawn(["sh", "-c", script], {}, paths)
    return pid, paths


def _wait_gone(pids, timeout_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [p for p in pids if procs.alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if procs.alive(p)]


def test_a_recorded_pid_with_another_start_time_is_not_killed(tmp_path):
    pid, paths = _spawn_sleeper(tmp_path, "stranger")
    try:
        recorded_pid, start = procs.read(paths.pid)[0]
        assert recorded_pid == pid and start == procs.start_time(pid)
        print(f"engine pid {pid} recorded with start time {start}")
        # the same pid, recorded at another start time: another process, whatever it runs
        paths.pid.write_text(f"{pid} {start - 1}\n")
        assert launcher.reap(paths) is False
        assert procs.alive(pid), "a pid whose start time differs was killed"
        assert not launcher.is_running(pid, start=start - 1)
        assert launcher.terminate(pid, start=start - 1, grace_s=1) is True   # "gone": not ours
        assert procs.alive(pid)
        rec = tmp_path / "run.sh.pids"
        rec.write_text(f"{pid} {start + 7}\n")
        assert procs.reap(rec, grace_s=1) == [] and procs.alive(pid)
        # with its real start time it is ours, and reaped
        paths.pid.write_text(f"{pid} {start}\n")
        assert launcher.reap(paths, grace_s=5) is True
        assert _wait_gone([pid]) == [] and not paths.pid.exists()
    finally:
        procs.stop(pid, grace_s=1)


def test_reaping_ends_the_whole_process_group_even_after_its_leader_died(tmp_path):
    # a leader with two children (like gunicorn's master and workers)
    pid, paths = _spawn_sleeper(tmp_path, "group", "sleep 300 & sleep 300 & wait")
    time.sleep(0.3)
    members = [s.pid for s in procs.group_members(pid)]
    assert pid in members and len(members) == 3, members
    # a leader that died and left its child behind (the recorded pid is gone)
    orphan_leader, orphan_paths = _spawn_sleeper(tmp_path, "orphaned", "sleep 300 & exit 0")
    time.sleep(0.3)
    assert _wait_gone([orphan_leader]) == []
    orphans = [s.pid for s in procs.group_members(orphan_leader)]
    assert len(orphans) == 1
    try:
        assert launcher.reap(paths, grace_s=5) is True
        assert _wait_gone(members) == []
        rec = tmp_path / "run.sh.pids"
        rec.write_text(orphan_paths.pid.read_text())
        assert procs.reap(rec, grace_s=5) == [orphan_leader]
        assert _wait_gone(orphans) == []
        print(f"group {pid}: {len(members)} processes ended; orphaned group "
              f"{orphan_leader}: {len(orphans)} left-behind child ended")
    finally:
        for p in members + orphans:
            procs.stop(p, grace_s=1)


def test_an_engine_its_dead_supervisor_left_is_reaped_at_the_next_start(app, tiny_model_dir,
                                                                        tmp_path):
    saved = app.config.get("POOLS_VAR_DIR")
    app.config["POOLS_VAR_DIR"] = str(tmp_path)
    node = f"reap{uuid.uuid4().hex[:6]}"
    pool = PoolFactory(name=f"reap-{node}", engine="reference", model=str(tiny_model_dir),
                       served_model_name="tiny", desired_replicas=1, base_port=free_port_pair(),
                       node=node, options={"threads": 1})
    sync_replica_rows(pool)
    db.session.commit()
    (replica,) = pool.replicas
    pids = []
    try:
        assert driver.start_replica(replica.id, wait_s=120) == "healthy"
        db.session.expire_all()
        old = db.session.get(Replica, replica.id).pid
        pids.append(old)
        # the worker died between committing "stopped" and ending the process: the row
        # names no pid, the engine still holds the port, only its pid file knows it
        replica = db.session.get(Replica, replica.id)
        replica.state, replica.pid = "stopped", None
        db.session.commit()
        assert procs.alive(old) and driver.recorded_pid(replica) == old
        assert driver.start_replica(replica.id, wait_s=120) == "healthy"
        db.session.expire_all()
        new = db.session.get(Replica, replica.id).pid
        pids.append(new)
        assert new != old and _wait_gone([old]) == [] and procs.alive(new)
        print(f"left-behind engine {old} reaped at the next start; new engine {new}")
        # and stop-engines (what run.sh calls at start and exit) ends it by the record too
        out = app.test_cli_runner().invoke(args=["sluice", "stop-engines", "--node", node])
        assert out.exit_code == 0 and "1 engine replica(s) stopped" in out.output, out.output
        assert _wait_gone([new]) == []
    finally:
        for pid in pids:
            launcher.terminate(pid, grace_s=5)
        app.config["POOLS_VAR_DIR"] = saved


def test_procs_cli_records_and_reaps(tmp_path):
    sleeper = subprocess.Popen(["setsid", "sleep", "300"])
    try:
        rec = tmp_path / "run.sh.pids"
        run = [sys.executable, "-m", "app.core.procs"]
        subprocess.run([*run, "record", str(rec), str(sleeper.pid)], check=True)
        assert procs.read(rec) == [(sleeper.pid, procs.start_time(sleeper.pid))]
        out = subprocess.run([*run, "reap", str(rec), "5"], check=True, capture_output=True,
                             text=True)
        assert sleeper.wait(timeout=10) is not None
        assert f"reaped 1 process group(s) a previous run left: {sleeper.pid}" in out.stderr
        assert not rec.exists()
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
