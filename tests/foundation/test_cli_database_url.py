"""A CLI command with a database URL that is unusable (unparsable, unknown database, driver
not installed) or unreachable (no such host, nothing listening, bad credentials) says which
URL and why in one line, without a traceback and without the password."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ports import dead_port

ROOT = Path(__file__).resolve().parents[2]


def _closed_port() -> int:
    return dead_port()


def _flask(url: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SLUICE_DATABASE_URL": url, "HF_HUB_OFFLINE": "1", "SLUICE_ENV": "dev"}
    env.pop("SLUICE_VERBOSE", None)
    flask = str(Path(sys.executable).with_name("flask"))
    return subprocess.run([flask, "--app", "wsgi", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("url,args,says", [
    ("postgresql://nohost.invalid/x", ("sluice", "stop-engines"),
     "cannot reach the database at postgresql://nohost.invalid/x"),
    (f"postgresql://sluice:hunter2@127.0.0.1:{_closed_port()}/x", ("db", "upgrade"),
     "cannot reach the database at postgresql://sluice:***@127.0.0.1:"),
    ("not a url", ("sluice", "stop-engines"), "SLUICE_DATABASE_URL 'not a url' is not usable"),
    ("nosuchdb://x/y", ("db", "upgrade"), "SLUICE_DATABASE_URL 'nosuchdb://x/y' is not usable"),
], ids=["unreachable-host", "closed-port-password-hidden", "not-a-url", "unknown-scheme"])
def test_a_bad_database_url_is_one_clear_line(url, args, says):
    out = _flask(url, *args)
    print(args, out.stderr.strip())
    assert out.returncode == 1, (args, out.stderr[-800:])
    assert says in out.stderr and "Error: " in out.stderr, out.stderr[-800:]
    assert "Traceback" not in out.stderr and "hunter2" not in out.stderr + out.stdout
