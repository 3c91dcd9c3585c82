"""Browser-like helpers: read the CSRF token from the page, then post the form."""
from __future__ import annotations

import re

from flask import g
from flask.testing import FlaskClient

from tests.factories import PASSWORD

_CSRF = re.compile(r'name="csrf_token"[^>]*value="([^"]+)"')


def csrf_from(html: str) -> str:
    match = _CSRF.search(html)
    assert match, "page has no CSRF token"
    return match.group(1)


def login(client, email: str, password: str = PASSWORD) -> None:
    page = client.get("/login")
    resp = client.post("/login", data={"email": email, "password": password,
                                       "csrf_token": csrf_from(page.get_data(as_text=True))})
    assert resp.status_code == 302, resp.get_data(as_text=True)


def submit(client, page_url: str, data: dict, action: str | None = None):
    """GET ``page_url`` like a browser, then POST ``data`` with the page's CSRF token
    to ``action`` (default: the same URL)."""
    page = client.get(page_url)
    assert page.status_code == 200, (page_url, page.status_code)
    token = csrf_from(page.get_data(as_text=True))
    return client.post(action or page_url, data={**data, "csrf_token": token})


class BrowserClient(FlaskClient):
    """A test client whose requests start without the previous request's ``g``.

    The ``app`` fixture keeps one app context pushed for the whole test, and Flask reuses
    it for requests, so ``g`` (where Flask-Login caches the signed-in user and Flask-WTF
    the CSRF token) would leak
    from one request, or one client, to the next. A browser never shares that.
    """

    def open(self, *args, **kwargs):
        for name in list(g):
            g.pop(name, None)
        return super().open(*args, **kwargs)


def browser(app) -> BrowserClient:
    return BrowserClient(app, app.response_class, use_cookies=True)
