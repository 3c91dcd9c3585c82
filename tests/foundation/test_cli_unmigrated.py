"""A CLI command on a database that was never migrated says what to run, not a traceback;
and no screen of alembic INFO lines on ordinary calls."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _flask(tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SLUICE_DATABASE_URL": f"sqlite:///{tmp_path / 'empty.db'}",
           "HF_HUB_OFFLINE": "1", "SLUICE_ENV": "dev"}
    flask = str(Path(sys.executable).with_name("flask"))
    return subprocess.run([flask, "--app", "wsgi", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_an_unmigrated_database_is_named_with_the_command_to_run(tmp_path):
    for args in (("adapters", "list"), ("sluice", "stop-engines")):
        out = _flask(tmp_path, *args)
        assert out.returncode != 0, args
        assert "run `flask --app wsgi db upgrade` first" in out.stderr, out.stderr[-800:]
        assert "Traceback" not in out.stderr and "INFO" not in out.stderr
    migrated = _flask(tmp_path, "db", "upgrade")
    assert migrated.returncode == 0
    listed = _flask(tmp_path, "adapters", "list")
    assert listed.returncode == 0 and "INFO" not in listed.stderr
