"""Engine fixtures: a tiny random Llama (SmolLM2 tokenizer) and running engine servers."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.ports import free_port  # noqa: F401 - engine tests import it from here

ROOT = Path(__file__).resolve().parents[2]


class EngineProcess:
    def __init__(self, model: str, name: str, log: Path, *, lora: bool = False,
                 extra: list[str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.name = name
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        if lora:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        else:
            env.pop("VLLM_ALLOW_RUNTIME_LORA_UPDATING", None)
        self.log_path = log
        self._log = open(log, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.engine", "--model", model, "--served-model-name", name,
             "--port", str(self.port), "--threads", "1", "--enable-prompt-tokens-details",
             *(extra or [])], cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_healthy(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"engine exited with {self.proc.returncode}")
            try:
                resp = httpx.get(f"{self.url}/health", timeout=2)
                if resp.status_code == 200:
                    return
                if resp.text.startswith("load failed"):     # it stays up, saying why
                    raise RuntimeError(f"engine {resp.text}")
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise TimeoutError("engine did not become healthy")

    def log_text(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def chat(self, content: str | list, **kw) -> httpx.Response:
        messages = content if isinstance(content, list) else [{"role": "user", "content": content}]
        body = {"model": self.name, "messages": messages, "temperature": 0, "max_tokens": 16}
        body.update(kw)
        return httpx.post(f"{self.url}/v1/chat/completions", json=body, timeout=120)

    def metric(self, name: str) -> float:
        from workers.pools.metrics import parse_prometheus
        samples = parse_prometheus(httpx.get(f"{self.url}/metrics", timeout=10).text)
        return sum(v for (n, _labels), v in samples.items() if n == name)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log.close()


@contextlib.contextmanager
def tiny_engines(tmp_path_factory, extras: list[list[str]], name: str = "tiny-served"):
    """One healthy tiny-Llama engine per entry of ``extras`` (its extra arguments), all
    stopped on the way out, whatever stopped some of them before."""
    from app.engine.model import build_tiny_llama
    model = build_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama")
    logs = tmp_path_factory.mktemp("engine-logs")
    engines = [EngineProcess(str(model), name, logs / f"e{i}.log", extra=extra)
               for i, extra in enumerate(extras)]
    try:
        for e in engines:
            e.wait_healthy()
        yield engines
    finally:
        for e in engines:
            if e.proc.poll() is None:
                e.stop()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from app.engine.model import build_tiny_llama
    return build_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama")


@pytest.fixture(scope="module")
def tiny_engine(tiny_model, tmp_path_factory):
    eng = EngineProcess(str(tiny_model), "tiny", tmp_path_factory.mktemp("log") / "engine.log",
                        lora=True, extra=["--max-prefix-tokens", "4096"])
    try:
        eng.wait_healthy()
        yield eng
    finally:
        eng.stop()
