"""Pools fixtures: a real Celery worker consuming ``pool.local`` (threads, so the
supervisor runs beside a replica start), and a tiny model for reference replicas."""
from __future__ import annotations

import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.gateway.conftest import frontier, gateway  # noqa: F401  (fixtures, reused)
from tests.workers.conftest import READY_TIMEOUT_S, ROOT, Worker, worker_env


def free_port_pair() -> int:
    """A port p with p and p+1 both free on 127.0.0.1 (a pool's base_port for 2 replicas)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            with socket.socket() as s2:
                s2.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from app.engine.model import build_tiny_llama
    return build_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama")


@pytest.fixture(scope="session")
def pool_worker(app_config, tmp_path_factory):
    celery_bin = Path(sys.executable).with_name("celery")
    log_path = tmp_path_factory.mktemp("poolworker") / "worker.log"
    env = worker_env(app_config)
    env["SLUICE_NODE"] = "local"
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [str(celery_bin), "-A", "workers.celery_app", "worker", "--pool", "threads",
             "--concurrency", "4", "-Q", "pool.local", "-n", f"pools-{uuid.uuid4().hex[:8]}@%h",
             "--loglevel", "INFO", "--without-mingle", "--without-gossip",
             "--without-heartbeat"],
            cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    worker = Worker(process, log_path)
    try:
        worker.wait_for(lambda: " ready." in worker.log(), READY_TIMEOUT_S, "worker ready")
        yield worker
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
