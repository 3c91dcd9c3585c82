"""Start and stop engine processes on this node.

An engine is started detached (the leader of its own session and process group, its
parent exits at once), so it outlives the Celery pool process that launched it (a worker
restart does not stop serving) and any other process on the node can check or stop it.
Its pid and start time (``app.core.procs``: the pair names the process, a reused pid is
never taken for it) go to ``var/run/pools/<replica>.pid``, output to
``var/log/pools/<replica>.log``. Stopping it ends its whole process group (vLLM's engine
core, any helper it started). An engine whose supervisor died is reaped at the next start
by that record (``reap``), never by name.
"""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from app.core import procs

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
    # re-parented (to init or the node's subreaper) and never becomes our zombie. setsid
    # (not a group leader here, so it execs in place: $! is the engine) makes it the
    # leader of its own process group, which stopping it ends as a whole.
    script = 'exec </dev/null; setsid "$@" >>"$SLUICE_ENGINE_LOG" 2>&1 & echo $!'
    out = subprocess.run(["sh", "-c", script, "sh", *argv], env=full_env, cwd=cwd,
                         capture_output=True, text=True, timeout=30, start_new_session=True,
                         check=True)
    pid = int(out.stdout.strip().splitlines()[-1])
    start = procs.start_time(pid)
    paths.pid.write_text(f"{pid} {start}\n" if start is not None else f"{pid}\n")
    return pid


def is_running(pid: int | None, port: int | None = None, *,
               start: int | None = None) -> bool:
    """Whether ``pid`` is a live (non-zombie) process; with ``start``, only if it is still
    the process that started then (pids get reused). Without a recorded start (a pid file
    from before start times were recorded), ``port`` must be in its command line."""
    if not pid or pid <= 0:
        return False
    if not procs.PROC.joinpath("self").exists():   # no procfs: trust kill(0)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    if not procs.alive(pid, start):
        return False
    if start is None and port is not None:
        try:
            cmdline = (procs.PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        return str(port).encode() in cmdline
    return True


def terminate(pid: int | None, *, grace_s: float = 15.0, port: int | None = None,
              start: int | None = None) -> bool:
    """SIGTERM to the engine's process group, SIGKILL after ``grace_s``; with ``start``,
    only if ``pid`` is still that process. True when nothing of it is left."""
    return procs.stop(pid, start, grace_s=grace_s)


def recorded_start(paths: ReplicaPaths, pid: int | None) -> int | None:
    """The start time the pid file recorded for ``pid`` (None: not recorded, or the file
    names another pid)."""
    rec = procs.read(paths.pid)
    return rec[0][1] if rec and pid and rec[0][0] == pid else None


def reap(paths: ReplicaPaths, *, grace_s: float = 15.0) -> bool:
    """End the engine the pid file names if it is still the recorded process (pid and
    start time); a pid the kernel gave to someone else is left alone. Removes the file.
    True when a live engine was ended."""
    rec = procs.read(paths.pid)
    ended = False
    if rec and rec[0][1] is not None and procs.alive(*rec[0]):
        ended = procs.stop(rec[0][0], rec[0][1], grace_s=grace_s)
    clear_pid(paths)
    return ended


def read_pid(paths: ReplicaPaths) -> int | None:
    rec = procs.read(paths.pid)
    return rec[0][0] if rec else None


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
