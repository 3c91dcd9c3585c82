"""The ``service`` embedding backend against real HTTP servers: our TEI-speaking embedding
server in its own process gives the in-process vectors, and a server that answers wrongly
(or not at all) is an error, never a silently different vector."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.contract.cache import embedding
from app.contract.cache.service_client import EmbeddingServiceError

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["What is the refund window for order ORD-4821?", "x", "",
         "Ünïcödé café 東京 🚀 naïve résumé", "How do I reset my password?"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def service_url():
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "app.contract.cache.embed_service",
                             "--port", str(port)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"embedding service did not start: {proc.stderr.read()[-2000:]!r}")
        time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(15)


@pytest.fixture()
def restore_settings():
    saved = embedding.current_settings()
    yield
    embedding.configure(**saved)


def test_the_service_backend_gives_the_in_process_vectors(service_url, restore_settings):
    local = embedding.embed_many(TEXTS)
    embedding.configure("service", url=service_url)
    assert embedding.get_encoder().name == "service"
    remote_many = embedding.embed_many(TEXTS)
    remote_one = np.stack([embedding.embed(t) for t in TEXTS])  # through the batcher
    assert ((remote_many * local).sum(axis=1) >= 0.9999).all()
    assert ((remote_one * local).sum(axis=1) >= 0.9999).all()


def test_the_server_speaks_teis_embed_api(service_url):
    one = httpx.post(service_url + "/embed", json={"inputs": "hello", "normalize": True})
    assert one.status_code == 200
    vecs = one.json()
    assert len(vecs) == 1 and len(vecs[0]) == embedding.DIM
    assert abs(np.linalg.norm(vecs[0]) - 1.0) < 1e-4
    many = httpx.post(service_url + "/embed", json={"inputs": ["a", "b", "c"]}).json()
    assert len(many) == 3
    bad = httpx.post(service_url + "/embed", json={"inputs": [1, 2]})
    assert bad.status_code == 422 and bad.json()["error_type"] == "Validation"
    info = httpx.get(service_url + "/info").json()
    assert info["model_id"] == "sentence-transformers/all-MiniLM-L6-v2"


class _WrongDimension(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        n = int(self.headers["content-length"])
        texts = json.loads(self.rfile.read(n))["inputs"]
        body = json.dumps([[0.5, 0.5] for _ in texts]).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_server_with_another_model_is_refused(restore_settings):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _WrongDimension)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        embedding.configure("service", url=f"http://127.0.0.1:{server.server_port}")
        with pytest.raises(EmbeddingServiceError, match="shape"):
            embedding.embed("hello")
    finally:
        server.shutdown()
        server.server_close()


def test_an_unreachable_service_is_an_error(restore_settings):
    embedding.configure("service", url=f"http://127.0.0.1:{_free_port()}", timeout_s=1.0)
    with pytest.raises(EmbeddingServiceError):
        embedding.embed("hello")


def test_service_needs_a_url():
    with pytest.raises(ValueError, match="EMBEDDING_URL"):
        embedding.configure("service")
