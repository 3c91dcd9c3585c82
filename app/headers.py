"""Security headers on every console and admin-API response (and a 400 for NUL
characters in form fields and query values, before any view).

The Content-Security-Policy allows scripts from the console itself (the bundled Plotly
and static/js) and inline scripts that carry this response's nonce (``csp_nonce()`` in
templates); no inline event handlers, no framing, no foreign form targets. Plotly sets
inline styles, so styles may be inline.
"""
from __future__ import annotations

import secrets

from flask import Flask, Response, g, request


def csp_nonce() -> str:
    nonce = g.get("csp_nonce")
    if nonce is None:
        nonce = g.csp_nonce = secrets.token_urlsafe(16)
    return nonce


def figure_html(fig) -> str:
    """A Plotly figure as an HTML fragment whose script carries this response's nonce
    (the bundle itself is served by the page)."""
    html = fig.to_html(full_html=False, include_plotlyjs=False, config={"displaylogo": False})
    return html.replace("<script", f"<script nonce=\"{csp_nonce()}\"")


def _add_headers(resp: Response) -> Response:
    policy = ("default-src 'self'; "
              f"script-src 'self' 'nonce-{csp_nonce()}'; "
              "style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
              "font-src 'self' data:; connect-src 'self'; object-src 'none'; "
              "base-uri 'self'; form-action 'self'; frame-ancestors 'none'")
    resp.headers.setdefault("Content-Security-Policy", policy)
    resp.headers.setdefault("X-Content-Type-Options", "nosniff")
    resp.headers.setdefault("X-Frame-Options", "DENY")
    resp.headers.setdefault("Referrer-Policy", "same-origin")
    return resp


def _refuse_nul() -> None:
    """No form field or query value takes a NUL character (PostgreSQL text cannot store
    one): a 400 before any view, instead of a database error after it."""
    from werkzeug.exceptions import BadRequest
    for values in (request.args, request.form if request.mimetype in (
            "application/x-www-form-urlencoded", "multipart/form-data") else {}):
        for key, value in values.items(multi=True) if values else ():
            if "\x00" in key or "\x00" in value:
                raise BadRequest("form fields and query values may not contain NUL characters")


def init_app(app: Flask) -> None:
    app.jinja_env.globals["csp_nonce"] = csp_nonce
    app.before_request(_refuse_nul)
    app.after_request(_add_headers)
