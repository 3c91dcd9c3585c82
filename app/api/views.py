"""JSON admin API under /api/v1 (bearer tokens of console users)."""
from __future__ import annotations

from functools import wraps

from flask import Blueprint, g, jsonify, request

from app.auth.service import user_for_token
from app.errors import ServiceError, ValidationError

bp = Blueprint("api", __name__)


def api_auth(fn):
    @wraps(fn)
    def wrapper(*args, **kwargs):
        header = request.headers.get("Authorization", "")
        token = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else ""
        user = user_for_token(token) if token else None
        if user is None:
            return jsonify(error={"code": "unauthorized",
                                  "message": "send a valid admin token as 'Authorization: "
                                             "Bearer <token>'", "fields": {}}), 401
        g.api_user = user
        return fn(*args, **kwargs)
    return wrapper


def body() -> dict:
    data = request.get_json(silent=True)
    if not isinstance(data, dict):
        raise ValidationError("the request body must be a JSON object", {"body": ["not a JSON object"]})
    return data


@bp.route("/me")
@api_auth
def me():
    return jsonify(g.api_user.to_dict())
