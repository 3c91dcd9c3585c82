"""The gateway's upstream HTTP/1.1 client against real servers: keep-alive reuse,
chunked streaming, https with certificate verification."""
from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import sys

import orjson
import pytest

from app.gateway import http1
from tests.gateway.conftest import ROOT, wait_for
from tests.gateway.test_failover import dead_url
from tests.ports import free_port

BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "a b c"}]})
STREAM = orjson.dumps({"model": "m", "stream": True,
                       "messages": [{"role": "user", "content": "a b c"}]})


def test_keep_alive_reuse_and_chunked_stream(fake_replicas):
    url = fake_replicas[0].url + "/v1/chat/completions"

    async def run():
        pool = http1.Pool()
        for _ in range(5):
            r = await pool.post(url, {"content-type": "application/json"}, BODY, 5)
            assert r.status_code == 200
            assert orjson.loads(await r.aread())["choices"][0]["message"]["content"] == "Echo: a b c"
        assert len(pool._all) == 1  # one connection served all five
        r = await pool.post(url, {}, STREAM, 5)
        raw = await r.aread()
        assert r.headers["content-type"].startswith("text/event-stream")
        assert raw.endswith(b"data: [DONE]\n\n") and raw.count(b"data: ") == 7  # role, 4 words, finish, DONE
        await pool.aclose()
    asyncio.run(run())


def test_connect_errors_are_typed():
    async def run():
        with pytest.raises(http1.ConnectError):
            await http1.Pool().post(dead_url() + "/v1/chat/completions", {}, BODY, 2)
    asyncio.run(run())


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl to make a cert")
def test_https_upstream_with_verified_certificate(tmp_path):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost"], check=True,
                   capture_output=True)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "--factory",
                             "tests.gateway.fake_upstream:create_fake", "--port", str(port),
                             "--ssl-keyfile", str(key), "--ssl-certfile", str(cert),
                             "--log-level", "warning"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"https://localhost:{port}/v1/chat/completions"
    try:
        async def call(ctx):
            r = await http1.Pool(ssl_context=ctx).post(url, {}, BODY, 5)
            return orjson.loads(await r.aread())

        def up() -> bool:
            try:
                asyncio.run(call(ssl.create_default_context(cafile=str(cert))))
                return True
            except http1.HTTPClientError:
                return False
        wait_for(up, what="https fake upstream")
        out = asyncio.run(call(ssl.create_default_context(cafile=str(cert))))
        assert out["choices"][0]["message"]["content"] == "Echo: a b c"
        with pytest.raises(http1.ConnectError):  # an unknown CA is refused
            asyncio.run(call(ssl.create_default_context()))
    finally:
        proc.kill()
        proc.wait(10)
