"""Browser tests: real headless Chromium (Debian's) driven by Playwright, against a real
console server on a free port; the gateway fixtures come from tests/gateway."""
from __future__ import annotations

import os
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
