"""Shared by every area's JSON admin API (``api_bp`` in ``app/<area>/views.py``, under
/api/v1): bearer-token auth and request parsing.

A token acts as its user, with that user's role and tenant scope. Routes call the same
service functions as the console; service errors become
``{"error": {"code", "message", "fields"}}`` with their status (app.console.errors).
"""
from __future__ import annotations

from functools import wraps

from flask import g, jsonify, request

from app.auth.service import user_for_token
from app.errors import ServiceError, TooManyAttempts


def api_auth(fn):
    @wraps(fn)
    def wrapper(*args, **kwargs):
        header = request.headers.get("Authorization", "")
        token = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else ""
        try:
            user = user_for_token(token, request.remote_addr or "") if token else None
        except TooManyAttempts as exc:
            return jsonify(error={"code": exc.code, "message": exc.message, "fields": {}}), 429
        if user is None:
            return jsonify(error={"code": "unauthorized",
                                  "message": "send a valid admin token as 'Authorization: "
                                             "Bearer <token>'", "fields": {}}), 401
        g.api_user = user
        return fn(*args, **kwargs)
    return wrapper


def _has_nul(value, depth: int = 0) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if depth > 64:
        return False   # deeper than any field the API reads
    if isinstance(value, dict):
        return any(_has_nul(k, depth + 1) or _has_nul(v, depth + 1) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v, depth + 1) for v in value)
    return False


def body() -> dict:
    """The request's JSON object, or a 400 (also for text with NUL characters, which no
    field takes and PostgreSQL text cannot store)."""
    data = request.get_json(silent=True)
    if not isinstance(data, dict):
        raise ServiceError("the request body must be a JSON object",
                           {"body": ["not a JSON object"]})
    if _has_nul(data):
        raise ServiceError("text fields may not contain NUL characters",
                           {"body": ["contains a NUL character"]})
    return data


def int_arg(name: str, default: int, lo: int, hi: int) -> int:
    raw = request.args.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or not lo <= value <= hi:
        raise ServiceError(f"bad query parameter {name}",
                           {name: [f"must be a whole number from {lo} to {hi}"]})
    return value
