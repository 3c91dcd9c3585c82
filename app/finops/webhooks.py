"""Where budget webhooks may go: https to a host on the public internet, or a host the
operator allowed (``WEBHOOK_ALLOWED_HOSTS``, comma-separated host names, e.g. an internal
alert relay). Checked when a budget is saved and again, after resolving the host, right
before each post: a tenant user cannot make the workers call Redis, the metadata service
or anything else on the private network."""
from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit


def allowed_hosts(config_value: str) -> set[str]:
    return {h.strip().lower() for h in (config_value or "").split(",") if h.strip()}


def _public(host: str) -> bool:
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    addrs = {ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos}
    return bool(addrs) and all(a.is_global for a in addrs)


def problem(url: str, allowed: set[str], *, resolve: bool = True) -> str | None:
    """Why ``url`` may not receive webhooks, or None when it may."""
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError:
        return "must be a valid URL"
    if parts.scheme not in ("http", "https") or not host:
        return "must be an http(s) URL"
    if host in allowed:
        return None
    if parts.scheme != "https":
        return "must be https (or a host the operator allowed)"
    if parts.username or parts.password:
        return "must not carry credentials"
    if resolve and not _public(host):
        return "must be a public address (or a host the operator allowed)"
    return None
