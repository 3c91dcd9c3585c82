"""Browser tests: real headless Chromium (Debian's) driven by Playwright, against a real
console server on a free port; the gateway fixtures come from tests/gateway."""
from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest


CHROMIUM = os.environ.get("SLUICE_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser():
    """Module-scoped: Playwright's sync API keeps an event loop running in this thread
    while open, which would break later tests that call asyncio.run()."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} missing: run scripts/setup.sh (installs Debian's chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture()
def console(app):
    """The console app served over real HTTP on 127.0.0.1:<free port>."""
    from werkzeug.serving import make_server
    server = make_server("127.0.0.1", 0, app, threaded=True)
    app.config["SERVER_NAME"] = None
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        app.config["SERVER_NAME"] = "localhost"


@pytest.fixture()
def page(browser):
    """A fresh page; the test fails if any page it opened broke the Content-Security-Policy
    or threw (a chart that silently did not draw is a failure too)."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    p = ctx.new_page()
    p.set_default_timeout(20_000)
    problems: list[str] = []
    p.on("console", lambda m: problems.append(m.text) if m.type == "error"
         and "Content Security Policy" in m.text else None)
    p.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    yield p
    ctx.close()
    assert not problems, problems


def sign_in(page, base: str, email: str) -> None:
    from tests.factories import PASSWORD
    page.goto(base + "/login")
    page.fill("input[name=email]", email)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/login" not in url)


@pytest.fixture(scope="module")
def node_worker(app_config, tmp_path_factory):
    """A real Celery worker on the flywheel tests' own node queue (``pool.flywheel``,
    tests/e2e/flywheel.py): it runs the pool's replica tasks and the adapters.load /
    adapters.unload the rollout queues."""
    from tests.celery_workers import start_worker
    from tests.e2e.flywheel import NODE
    with start_worker(app_config, tmp_path_factory.mktemp("flywheelnode"),
                      queue=f"pool.{NODE}", name="flywheel",
                      pool_args=("--pool", "threads", "--concurrency", "2"),
                      extra_env={"SLUICE_NODE": NODE}) as worker:
        yield worker


@pytest.fixture()
def own_files():
    """Files and folders a test made under ADAPTERS_DIR (its dataset, its artifact),
    removed afterwards; nothing else there is touched (the session's tests share it)."""
    paths: list[Path] = []
    yield paths
    for p in paths:
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
