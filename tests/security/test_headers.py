"""Security finding 12 (headers): every console page and admin-API answer carries a CSP
that allows only the console's own scripts and nonce'd inline ones, no framing, nosniff."""
from __future__ import annotations

import re

from tests.console.web import browser, login
from tests.factories import UserFactory


def test_pages_and_api_answers_carry_the_security_headers(app):
    client = browser(app)
    login(client, UserFactory(role="admin").email)
    for url in ("/login", "/", "/finops", "/catalog/tiers", "/api/v1/me"):
        resp = client.get(url)
        csp = resp.headers.get("Content-Security-Policy", "")
        assert "frame-ancestors 'none'" in csp and "object-src 'none'" in csp, url
        assert re.search(r"script-src 'self' 'nonce-[\w-]+'", csp), url
        assert "unsafe-inline" not in csp.split("script-src")[1].split(";")[0], url
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        assert resp.headers["X-Frame-Options"] == "DENY"


def test_inline_scripts_carry_this_responses_nonce_and_no_handler_is_inline(app):
    client = browser(app)
    login(client, UserFactory(role="finops").email)
    resp = client.get("/finops")
    nonce = re.search(r"'nonce-([\w-]+)'", resp.headers["Content-Security-Policy"]).group(1)
    html = resp.get_data(as_text=True)
    for tag in re.findall(r"<script\b[^>]*>", html):
        assert "src=" in tag or f'nonce="{nonce}"' in tag, tag
    assert not re.search(r"\son(click|change|submit|load)=", html)
    # a new response, a new nonce
    again = client.get("/finops").headers["Content-Security-Policy"]
    assert nonce not in again
