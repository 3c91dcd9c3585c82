"""Start and stop engine processes on this node.

An engine is started detached (its own session, parent exits at once), so it outlives
the Celery pool process that launched it and any other process on the node can check
or stop it by pid. The pid goes to ``var/run/pools/<replica>.pid`` and output to
``var/log/pools/<replica>.log``.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class ReplicaPaths:
    pid: Path
    log: Path


def replica_paths(var_dir: Path, replica_name: str) -> ReplicaPaths:
    return ReplicaPaths(pid=var_dir / "run" / "pools" / f"{replica_name}.pid",
                        log=var_dir / "log" / "pools" / f"{replica_name}.log")


def spawn(argv: list[str], env: dict[str, str], paths: ReplicaPaths, *,
          cwd: Path = ROOT) -> int:
    """Start ``argv`` detached; returns the engine's pid (also written to the pid file)."""
    paths.pid.parent.mkdir(parents=True, exist_ok=True)
    paths.log.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, **env, "SLUICE_ENGINE_LOG": str(paths.log)}
    # sh starts the engine in the background, prints its pid and exits: the engine is
    # re-parented (to init or the node's subreaper) and never becomes our zombie.
    script = 'exec </dev/null; "$@" >>"$SLUICE_ENGINE_LOG" 2>&1 & echo $!'
    out = subprocess.run(["sh", "-c", script, "sh", *argv], env=full_env, cwd=cwd,
                         capture_output=True, text=True, timeout=30, start_new_session=True,
                         check=True)
    pid = int(out.stdout.strip().splitlines()[-1])
    paths.pid.write_text(f"{pid}\n")
    return pid


def _proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def is_running(pid: int | None, port: int | None = None) -> bool:
    """Whether ``pid`` is a live (non-zombie) process; with ``port``, also that it is
    our engine on that port (pids get reused)."""
    if not pid or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    state = _proc_state(pid)
    if state is None:
        return not Path("/proc/self").exists()  # no procfs: trust kill(0)
    if state in ("Z", "X"):
        return False
    if port is not None:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        if str(port).encode() not in cmdline:
            return False
    return True


def terminate(pid: int | None, *, grace_s: float = 15.0, port: int | None = None) -> bool:
    """SIGTERM, then SIGKILL after ``grace_s``; True when the process is gone."""
    if not is_running(pid, port):
        return True
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not is_running(pid):
            return True
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and is_running(pid):
        time.sleep(0.05)
    return not is_running(pid)


def read_pid(paths: ReplicaPaths) -> int | None:
    try:
        return int(paths.pid.read_text().strip())
    except (OSError, ValueError):
        return None


def clear_pid(paths: ReplicaPaths) -> None:
    paths.pid.unlink(missing_ok=True)


def log_tail(paths: ReplicaPaths, max_chars: int = 400) -> str:
    try:
        with open(paths.log, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_chars))
            return f.read().decode(errors="replace")
    except OSError:
        return ""
