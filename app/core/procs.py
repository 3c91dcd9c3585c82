"""Who owns a process, read from ``/proc``: a process is named by its pid *and* its start
time (field 22 of ``/proc/<pid>/stat``, clock ticks since boot), so a pid the kernel has
since given to another process is never mistaken for ours, and nothing is ever found by
its name or command line.

What Sluice starts on a node is recorded this way (``scripts/run.sh``'s children in
``<var>/run/run.sh.pids``, each engine replica in ``<var>/run/pools/<replica>.pid``) and
started as the leader of its own process group, so stopping it stops what it started in
turn (gunicorn's and Celery's workers, an engine's helpers). A record whose owner died
without stopping it (``kill -9`` of run.sh, a worker killed mid-stop) is reaped at the
next start: the recorded process group is ended only when its leader still has the
recorded start time.

Run as ``python -m app.core.procs record FILE PID...`` (append ``PID START`` lines) or
``python -m app.core.procs reap FILE [GRACE_S]`` (end every recorded group, then remove
the file); stdlib only, so run.sh can call it before anything is installed.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class Stat:
    pid: int
    state: str
    ppid: int
    pgrp: int
    session: int
    start: int      # clock ticks after boot


def stat(pid: int | None) -> Stat | None:
    """The process's ``/proc/<pid>/stat``, or None when there is no such process."""
    if not pid or pid <= 0:
        return None
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    # the command name (field 2) is in parentheses and may hold spaces or ")"
    fields = raw.rsplit(")", 1)[1].split()
    return Stat(pid=pid, state=fields[0], ppid=int(fields[1]), pgrp=int(fields[2]),
                session=int(fields[3]), start=int(fields[19]))


def start_time(pid: int | None) -> int | None:
    s = stat(pid)
    return s.start if s else None


def alive(pid: int | None, start: int | None = None) -> bool:
    """A live (not zombie) process ``pid``; with ``start``, only if it is still the
    process that had that start time."""
    s = stat(pid)
    if s is None or s.state in ("Z", "X"):
        return False
    return start is None or s.start == start


def all_stats() -> list[Stat]:
    out = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            s = stat(int(entry.name))
            if s is not None:
                out.append(s)
    return out


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` by parent links (children re-parented to init
    after their parent died are not found this way: see ``group_members``)."""
    children: dict[int, list[int]] = {}
    for s in all_stats():
        children.setdefault(s.ppid, []).append(s.pid)
    found, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in found:
                found.add(c)
                todo.append(c)
    return found


def group_members(pgrp: int) -> list[Stat]:
    return [s for s in all_stats() if s.pgrp == pgrp and s.state not in ("Z", "X")]


def _owned_group(pid: int, start: int | None) -> int | None:
    """The process group to end for the record (pid, start), or None when nothing of it
    is left (or the pid now names somebody else's process)."""
    s = stat(pid)
    if s is not None and s.state not in ("Z", "X"):
        if start is not None and s.start != start:
            return None             # the pid was reused: not ours
        return pid if s.pgrp == pid else None
    # The leader is gone. While any member of its group lives, the kernel does not hand
    # its number out again, so members that started after the leader are the leader's.
    if start is not None and any(m.start >= start for m in group_members(pid)):
        return pid
    return None


def _signal(pid: int, group: bool, sig: int) -> None:
    try:
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop(pid: int | None, start: int | None = None, *, grace_s: float = 15.0) -> bool:
    """End the process (its whole group when it leads one): SIGTERM, SIGKILL after
    ``grace_s``. With ``start``, only if ``pid`` is still the process started then.
    True when nothing of it is left."""
    if not pid or pid <= 0:
        return True
    group = _owned_group(pid, start)
    s = stat(pid)
    if group is None:
        if s is None or s.state in ("Z", "X") or (start is not None and s.start != start):
            return True             # gone, or a stranger with a reused pid
        group_alive = False
    else:
        group_alive = True

    def left() -> bool:
        if group_alive:
            return bool(group_members(pid))
        return alive(pid, start)

    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        _signal(pid, group_alive, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not left():
                return True
            time.sleep(0.05)
    return not left()


def record(path: Path, pids: list[int]) -> None:
    """Append ``PID START`` for each live pid to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        for pid in pids:
            start = start_time(pid)
            if start is not None:
                f.write(f"{pid} {start}\n")


def read(path: Path) -> list[tuple[int, int | None]]:
    """The (pid, start) records in ``path`` (start None for a bare pid line)."""
    out = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split()
        try:
            out.append((int(parts[0]), int(parts[1]) if len(parts) > 1 else None))
        except (IndexError, ValueError):
            continue
    return out


def reap(path: Path, *, grace_s: float = 15.0) -> list[int]:
    """End every process group recorded in ``path`` whose leader is still the recorded
    process (a pid with another start time is left alone), then remove the file.
    Returns the pids that were still running and were ended."""
    ended = []
    for pid, start in read(path):
        if start is None:
            continue                # no start time: cannot tell it is ours
        if _owned_group(pid, start) is not None or alive(pid, start):
            stop(pid, start, grace_s=grace_s)
            ended.append(pid)
    path.unlink(missing_ok=True)
    return ended


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "record":
        record(Path(argv[1]), [int(p) for p in argv[2:]])
        return 0
    if len(argv) in (2, 3) and argv[0] == "reap":
        ended = reap(Path(argv[1]), grace_s=float(argv[2]) if len(argv) == 3 else 15.0)
        if ended:
            print(f"reaped {len(ended)} process group(s) a previous run left: "
                  f"{' '.join(map(str, ended))}", file=sys.stderr)
        return 0
    print("usage: python -m app.core.procs record FILE PID... | reap FILE [GRACE_S]",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
