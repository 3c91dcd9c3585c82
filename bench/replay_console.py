"""The replayed month in the console: rollups rebuilt from the (restamped) ledger, the
console served over real HTTP, and headless Chromium (Debian's, driven by Playwright, as
tests/e2e do) signed in as FinOps taking the FinOps page of the month."""
from __future__ import annotations

import os
import threading
from pathlib import Path

CHROMIUM = os.environ.get("SLUICE_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
CHARTS = ("chart-spend", "chart-tiers", "chart-cache", "chart-ttft", "chart-unit")


def screenshot(stack, period: str, path: str, email: str = "finops@replay.example",
               password: str = "Replay-pass-123") -> Path:
    from playwright.sync_api import sync_playwright
    from werkzeug.serving import make_server
    from app.finops import rollups
    rollups.rebuild_all()
    app = stack.app
    app.config["SERVER_NAME"] = None
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_port}"
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
            try:
                page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
                page.set_default_timeout(30_000)
                page.goto(base + "/login")
                page.fill("input[name=email]", email)
                page.fill("input[name=password]", password)
                page.click("button[type=submit]")
                page.wait_for_url(lambda url: "/login" not in url)
                page.goto(base + f"/finops?period={period}")
                for cid in CHARTS:
                    page.wait_for_selector(f"#{cid} .main-svg", state="attached")
                page.wait_for_timeout(500)
                page.screenshot(path=str(out), full_page=True)
            finally:
                browser.close()
    finally:
        server.shutdown()
        app.config["SERVER_NAME"] = "localhost"
    return out
