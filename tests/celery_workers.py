"""Start a real Celery worker bound to this test session's database and Redis namespace.

Fixtures (``celery_worker`` in tests/conftest.py, ``pool_worker`` in tests/pools) build on
``start_worker``; each is defined once, so a session never runs two workers competing for
the same queue (an imported fixture is a second definition with its own worker)."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 120


@dataclass
class Worker:
    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, predicate, timeout_s: float = 60, what: str = "condition"):
        """Poll ``predicate()`` until it returns something truthy (and return that)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            if self.process.poll() is not None:
                raise AssertionError(f"worker exited ({self.process.returncode}):\n{self.log()}")
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; worker log:\n{self.log()[-4000:]}")


def worker_env(app_config: dict) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.update(SLUICE_ENV="test", SLUICE_DATABASE_URL=app_config["SQLALCHEMY_DATABASE_URI"],
               SLUICE_REDIS_URL=app_config["REDIS_URL"],
               SLUICE_REDIS_NAMESPACE=app_config["REDIS_NAMESPACE"],
               SLUICE_SECRET_KEY=app_config["SECRET_KEY"],
               SLUICE_QDRANT_PATH=app_config["QDRANT_PATH"],
               SLUICE_ADAPTERS_DIR=app_config["ADAPTERS_DIR"],
               SLUICE_POOLS_VAR_DIR=app_config["POOLS_VAR_DIR"],
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    return env


@contextlib.contextmanager
def start_worker(app_config: dict, log_dir: Path, *, queue: str, name: str,
                 pool_args: tuple[str, ...] = ("--pool", "solo"),
                 extra_env: dict[str, str] | None = None) -> Iterator[Worker]:
    celery_bin = Path(sys.executable).with_name("celery")
    log_path = log_dir / "worker.log"
    env = worker_env(app_config) | (extra_env or {})
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [str(celery_bin), "-A", "workers.celery_app", "worker", *pool_args,
             "-Q", queue, "-n", f"{name}-{uuid.uuid4().hex[:8]}@%h", "--loglevel", "INFO",
             "--without-mingle", "--without-gossip", "--without-heartbeat"],
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
