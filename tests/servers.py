"""Real server processes for tests: fake OpenAI upstreams and the gateway, each a uvicorn
subprocess (``tests.gateway.serve``) on a port the OS picked."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FRONTIER_KEY = "sk-frontier-test-key"


class Server:
    def __init__(self, kind: str, arg: str, env: dict | None = None, log_dir: Path | None = None):
        self.log = open((log_dir or Path("/tmp")) / f"sluice-{kind}-{os.getpid()}-{id(self)}.log",
                        "w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.gateway.serve", kind, arg], cwd=ROOT,
            stdout=subprocess.PIPE, stderr=self.log, text=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **(env or {})})
        ready, _, _ = select.select([self.proc.stdout], [], [], 180)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("PORT "):
            self.log.flush()
            self.log.seek(0)
            tail = self.log.read()[-2000:]
            self.stop()
            raise RuntimeError(f"{kind} did not start: {line!r} {tail}")
        self.port = int(line.split()[1])
        self.url = f"http://127.0.0.1:{self.port}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()
