"""The import rules of docs/architecture.md, read from the code itself.

- The data plane (``app.gateway``, ``app.engine``, ``app.contract`` and the node-side pool
  modules that talk to engines) imports only ``app.contract``, ``app.core``, ``config``
  and its own package: never Flask, SQLAlchemy, Celery or a control-plane area.
- ``app.core`` is pure: it imports nothing of ours outside ``app.core``.
- Importing the gateway or the engine loads no Flask and no SQLAlchemy.

Every ``import`` statement counts, including those inside functions: a lazy import of a
console area from the hot path is the same dependency, only later.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = ("app", "workers", "config", "wsgi")
FORBIDDEN_THIRD_PARTY = ("flask", "flask_sqlalchemy", "flask_login", "flask_wtf",
                         "flask_migrate", "sqlalchemy", "alembic", "celery", "wtforms")
NODE_SIDE = ["workers/pools/health.py", "workers/pools/launcher.py", "workers/pools/lora.py",
             "workers/pools/metrics.py", "workers/pools/vllm_cmd.py",
             "workers/pools/engine_options.py"]


def _modules_imported(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
            # "from app.contract import budget" names submodules too
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names
                    if node.module in ("app", "app.contract", "app.core")]
    return out


def _files(*globs: str) -> list[Path]:
    found = []
    for g in globs:
        found += sorted(ROOT.glob(g))
    return found


def _allowed_for(own: str):
    def ok(module: str) -> bool:
        top = module.split(".")[0]
        if top in FORBIDDEN_THIRD_PARTY:
            return False
        if top not in OURS:
            return True
        return (module == "app" or module == "config"
                or module.startswith(("app.contract", "app.core", own)))
    return ok


DATA_PLANE = [(p, own) for own, g in (("app.gateway", "app/gateway/**/*.py"),
                                      ("app.engine", "app/engine/**/*.py"),
                                      ("app.contract", "app/contract/**/*.py"))
              for p in _files(g)] + [(ROOT / p, "workers.pools") for p in NODE_SIDE]


def test_the_rule_sees_the_whole_data_plane():
    # a glob that matches nothing would make the rule below vacuous
    assert len(DATA_PLANE) > 40
    assert {own for _, own in DATA_PLANE} == {"app.gateway", "app.engine", "app.contract",
                                             "workers.pools"}


@pytest.mark.parametrize("path,own", DATA_PLANE, ids=lambda v: str(v).replace(str(ROOT), ""))
def test_data_plane_imports_only_the_contract_core_and_config(path, own):
    ok = _allowed_for(own)
    bad = [f"{path.relative_to(ROOT)}:{line} imports {m}"
           for line, m in _modules_imported(path) if not ok(m)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path", _files("app/core/**/*.py"),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_core_is_pure(path):
    bad = [f"{path.relative_to(ROOT)}:{line} imports {m}" for line, m in _modules_imported(path)
           if m.split(".")[0] in OURS and not m.startswith("app.core")
           or m.split(".")[0] in FORBIDDEN_THIRD_PARTY]
    assert not bad, "\n".join(bad)


def test_the_rule_flags_a_forbidden_import(tmp_path):
    # the checker itself: a gateway module reaching a console area or Flask is caught
    bad = tmp_path / "bad.py"
    bad.write_text("import flask\n\ndef f():\n    from app.finops.service import run_rollups\n"
                   "    from app.contract import keys\n")
    ok = _allowed_for("app.gateway")
    assert [m for _, m in _modules_imported(bad) if not ok(m)] == ["flask",
                                                                   "app.finops.service"]


@pytest.mark.parametrize("module", ["app.gateway.asgi", "app.engine.server",
                                    "app.engine.__main__", "workers.pools.vllm_cmd"])
def test_importing_the_data_plane_loads_no_flask_or_sqlalchemy(module):
    code = (f"import sys, {module}\n"
            "leaked = sorted(m for m in sys.modules if m.split('.')[0] in "
            f"{FORBIDDEN_THIRD_PARTY!r})\n"
            "print(','.join(leaked))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"{module} loaded {out.stdout.strip()}"


def test_redis_keys_are_spelt_only_in_the_keyspace():
    """Every Redis key both planes touch is a named method of app.contract.keys.Keys: no
    module builds one by hand (``.k(...)`` or an f-string on the namespace)."""
    import re
    pattern = re.compile(r"\.k\(|f[\"']\{(ns|namespace|self\.ns|self\.namespace|_ns\(\))\}:")
    bad = [f"{p.relative_to(ROOT)}:{i}" for p in _files("app/**/*.py", "workers/**/*.py")
           if p != ROOT / "app/contract/keys.py"
           for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not bad, "build keys with app.contract.keys.Keys: " + ", ".join(bad)
