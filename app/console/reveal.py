"""Show a just-created secret (a tenant API key, an admin token) exactly once, after a
redirect: POST creates it and redirects; the GET that follows shows it; a reload shows
it no more and creates nothing.

The plaintext waits in Redis (``Keys.secret_reveal``) for ``CONSOLE_REVEAL_TTL_S``
seconds under a random token that only the creating user's signed session knows; the
GET takes it with GETDEL, so it is read at most once. It is never logged, never in the
session cookie, and never written to SQL (which keeps only the hash)."""
from __future__ import annotations

import json
import secrets

from flask import current_app, session
from flask_login import current_user

from app.redis_client import get_redis, keys

_SESSION = "reveal"


def stash(kind: str, ref: int, plaintext: str) -> None:
    """Hold ``plaintext`` (of ``kind`` #``ref``) for the next page this user loads."""
    token = secrets.token_urlsafe(18)
    get_redis().set(keys().secret_reveal(token),
                    json.dumps({"kind": kind, "ref": ref, "user": current_user.id,
                                "secret": plaintext}),
                    ex=int(current_app.config["CONSOLE_REVEAL_TTL_S"]))
    session[_SESSION] = {**session.get(_SESSION, {}), kind: token}


def take(kind: str) -> tuple[int, str] | None:
    """(ref, plaintext) stashed by this user for ``kind``, once; None afterwards."""
    pending = dict(session.get(_SESSION, {}))
    token = pending.pop(kind, None)
    if token is None:
        return None
    session[_SESSION] = pending
    raw = get_redis().getdel(keys().secret_reveal(token))
    if raw is None:
        return None
    held = json.loads(raw)
    if held.get("kind") != kind or held.get("user") != current_user.id:
        return None
    return int(held["ref"]), str(held["secret"])
