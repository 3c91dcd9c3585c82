"""``scripts/run.sh`` on embedded defaults (SQLite and logs in a temporary data dir, an
embedded redis-server, free ports), stopped with SIGINT, leaves no process of its tree
and no port it listened on: the worker, beat, both gunicorns and their workers, the
embedded Redis, the tier-3 stand-in and the engine replicas the worker started (detached,
in their own sessions, so they are found by the run's environment, not by parentage)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from app.core import procs
from tests.pools.conftest import free_port_run

ROOT = Path(__file__).resolve().parents[2]
MARK = "SLUICE_RUNSH_TEST_MARK"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _free_ports(n: int, *, taken: set[int]) -> list[int]:
    out = []
    while len(out) < n:
        p = free_port_run(1)
        if p not in taken and p not in out:
            out.append(p)
    return out


def _pool_port(taken: set[int]) -> int:
    """p with p and p + 10 free (the seeded pools' engines)."""
    for _ in range(200):
        p = free_port_run(1)
        if p + 10 > 65535 or p in taken or p + 10 in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p + 10))
            except OSError:
                continue
        return p
    raise RuntimeError("no free port pair 10 apart")


def _marked(mark: str) -> set[int]:
    """Every live process whose environment carries the run's mark."""
    needle = f"{MARK}={mark}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0") and procs.alive(int(entry.name)):
            found.add(int(entry.name))
    return found


def _listening_ports(pids: set[int]) -> set[int]:
    """TCP ports in LISTEN state held by a socket of one of ``pids``."""
    inodes = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                try:
                    link = os.readlink(fd)
                except OSError:
                    continue
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            continue
    return {port for port, inode in _listen_table() if inode in inodes}


def _listen_table() -> list[tuple[int, str]]:
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A":   # LISTEN
                out.append((int(f[1].rsplit(":", 1)[1], 16), f[9]))
    return out


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status == 200
    except Exception:  # noqa: BLE001 - not up yet
        return False


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:100]
    except OSError:
        return "?"


def _default_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def _state(pid: int) -> str:
    """What a process that will not exit is doing: state, kernel wait channel, signal
    masks, and its children."""
    try:
        status = {k: v.strip() for k, v in (line.split(":", 1) for line in
                  Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)}
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except OSError as exc:
        return f"pid {pid}: {exc}"
    kids = [(p, _cmd(p)) for p in procs.descendants(pid)]
    return (f"pid {pid} state {status.get('State')} wchan {wchan} SigBlk {status.get('SigBlk')} "
            f"SigIgn {status.get('SigIgn')} SigCgt {status.get('SigCgt')} children {kids}")


@pytest.mark.parametrize("how", ["sigint", "hangup_behind_tee"])
def test_run_sh_stopped_leaves_no_process_and_no_port(tmp_path, how):
    """``sigint``: Ctrl-C with the output in a file. ``hangup_behind_tee``: the output
    piped to ``tee``, then the terminal closes: tee dies first (SIGHUP, as Ctrl-C kills it
    under ``run.sh | tee log``) and run.sh gets SIGHUP with nobody reading its stdout. A
    run.sh without a HUP trap died at once, and one whose cleanup echoed to the dead pipe
    died of SIGPIPE before stopping anything (seen by hand: 14 processes left)."""
    taken: set[int] = set()
    console, gateway, frontier, redis_port = _free_ports(4, taken=taken)
    taken |= {console, gateway, frontier, redis_port}
    pool = _pool_port(taken)
    mark = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.update({
        MARK: mark, "SLUICE_ENV": "dev", "SLUICE_VAR_DIR": str(tmp_path / "var"),
        "SLUICE_CONSOLE_PORT": str(console), "SLUICE_GATEWAY_PORT": str(gateway),
        "SLUICE_FRONTIER_PORT": str(frontier), "SLUICE_POOL_PORT": str(pool),
        "SLUICE_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "SLUICE_NODE": f"runsh{mark[:6]}",
        "SLUICE_ADMIN_EMAIL": "admin@runsh.example",
        "SLUICE_ADMIN_PASSWORD": f"Run-sh-{mark}-pw!",
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
    })
    log = open(tmp_path / "run.sh.out", "w")
    tee = None
    if how == "hangup_behind_tee":
        tee = subprocess.Popen(["tee", str(tmp_path / "run.sh.out")], stdin=subprocess.PIPE,
                               stdout=subprocess.DEVNULL, preexec_fn=_default_signals)
    # as from a terminal: a suite started in the background (`./scripts/test.sh &`, nohup)
    # hands its children SIGINT, SIGQUIT and SIGHUP ignored, and a non-interactive bash can
    # never trap a signal that was ignored when it started (seen: SigIgn 0x7 on run.sh)
    run = subprocess.Popen(["bash", "scripts/run.sh"], cwd=ROOT, env=env,
                           stdout=tee.stdin if tee else log, stderr=subprocess.STDOUT,
                           preexec_fn=_default_signals)
    if tee:
        tee.stdin.close()   # run.sh holds the only write end, as behind a shell's pipe
    seen: dict[int, int | None] = {}   # pid -> start time, as first seen
    ports: set[int] = set()

    def observe() -> None:
        tree = _marked(mark) | procs.descendants(run.pid)
        for p in tree:
            seen.setdefault(p, procs.start_time(p))
        ports.update(_listening_ports(tree))

    try:
        wanted = {
            "console": f"http://127.0.0.1:{console}/login",
            "gateway": f"http://127.0.0.1:{gateway}/healthz",
            "tier1 engine": f"http://127.0.0.1:{pool}/health",
            "tier2 engine": f"http://127.0.0.1:{pool + 10}/health",
            "frontier stand-in": f"http://127.0.0.1:{frontier}/health",
        }
        up: set[str] = set()
        deadline = time.monotonic() + 420
        while time.monotonic() < deadline and up != set(wanted):
            assert run.poll() is None, (tmp_path / "run.sh.out").read_text()[-3000:]
            up |= {name for name, url in wanted.items() if name not in up and _answers(url)}
            observe()
            time.sleep(1)
        assert up == set(wanted), f"not up: {set(wanted) - up}\n" + \
            (tmp_path / "run.sh.out").read_text()[-3000:]
        time.sleep(2)
        observe()
        engines = [p for p in seen if "app.engine" in _cmd(p)]
        print(f"run.sh tree: {len(seen)} processes, {len(engines)} engines, "
              f"listening on {sorted(ports)}")
        assert len(engines) >= 3, [_cmd(p) for p in seen]
        assert {console, gateway, frontier, pool, pool + 10, redis_port} <= ports

        if tee:
            tee.send_signal(signal.SIGHUP)
            tee.wait(timeout=30)
        run.send_signal(signal.SIGHUP if tee else signal.SIGINT)
        try:
            rc = run.wait(timeout=180)
        except subprocess.TimeoutExpired:
            pytest.fail(f"run.sh still running 180 s after the signal: {_state(run.pid)}\n"
                        + (tmp_path / "run.sh.out").read_text()[-3000:])
        out = (tmp_path / "run.sh.out").read_text()
        time.sleep(0.5)
        left = [p for p, start in seen.items() if start is not None and procs.alive(p, start)]
        left += sorted(_marked(mark))
        assert not left, f"left running after {how}: {[(p, _cmd(p)) for p in set(left)]}"
        said = (tmp_path / "var" / "log" / "run.log").read_text()
        assert "run: stopped" in said, (said, out[-3000:])
        if not tee:
            assert "run: stopped" in out, out[-3000:]
        assert rc == (129 if tee else 130), rc
        held = {port for port, _ in _listen_table()} & ports
        assert not held, f"ports still listening: {sorted(held)}"
        for port in sorted(ports):
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", port))   # raises if anything still holds it
        print(f"after {how} (exit {rc}): 0 of {len(seen)} processes left, "
              f"{len(ports)} ports free")
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGTERM)
            try:
                run.wait(timeout=60)
            except subprocess.TimeoutExpired:
                run.kill()
                run.wait()
        for pid in _marked(mark):
            procs.stop(pid, grace_s=2)
        if tee and tee.poll() is None:
            tee.kill()
            tee.wait()
        log.close()


def test_run_sh_names_a_busy_port_and_starts_nothing(tmp_path):
    """A port run.sh binds itself that something else holds was seen only as a gateway
    that exited after everything had started, and run.sh stopped without saying why. It
    now names the port and the variable that moves it, before starting anything."""
    mark = uuid.uuid4().hex
    console, gateway, frontier, redis_port = _free_ports(4, taken=set())
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.update({MARK: mark, "SLUICE_ENV": "dev", "SLUICE_VAR_DIR": str(tmp_path / "var"),
                "SLUICE_CONSOLE_PORT": str(console), "SLUICE_GATEWAY_PORT": str(gateway),
                "SLUICE_FRONTIER_PORT": str(frontier),
                "SLUICE_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", gateway))
        busy.listen()
        done = subprocess.run(["bash", "scripts/run.sh"], cwd=ROOT, env=env, timeout=600,
                              capture_output=True, text=True, preexec_fn=_default_signals)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    assert f"port {gateway} (gateway) is already in use" in out, out[-3000:]
    assert "SLUICE_GATEWAY_PORT" in out and "run: stopped" in out
    assert "embedded one" not in out and not _marked(mark), out[-3000:]
