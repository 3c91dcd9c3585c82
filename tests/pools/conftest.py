"""Pools fixtures: a real Celery worker consuming ``pool.local`` (threads, so the
supervisor runs beside a replica start), and a tiny model for reference replicas."""
from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.celery_workers import start_worker


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
    with start_worker(app_config, tmp_path_factory.mktemp("poolworker"), queue="pool.local",
                      name="pools", pool_args=("--pool", "threads", "--concurrency", "4"),
                      extra_env={"SLUICE_NODE": "local"}) as worker:
        yield worker
