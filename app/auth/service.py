"""Users, sign-in and admin API tokens."""
from __future__ import annotations

import re
import secrets
from functools import lru_cache

from app.audit.service import record
from app.auth import throttle
from app.auth.models import ROLES, AdminToken, User
from app.errors import Conflict, Forbidden, NotFound, ValidationError
from app.extensions import db
from app.models_base import row_id
from app.models_base import utcnow
from app.security import (ADMIN_PREFIX, hash_password, new_token, password_problems,
                          token_hash, verify_password)
from app.tenants.models import Tenant

_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")


def authenticate(email: str, password: str, addr: str = "") -> User | None:
    """The user for these credentials, or None. Raises TooManyAttempts while the account
    or the client address is locked (app.auth.throttle). An unknown email costs the same
    password check as a known one, so timing does not tell which emails exist."""
    email = email.strip().lower()
    throttle.check(email, addr)
    user = db.session.scalar(db.select(User).where(User.email == email))
    ok = verify_password(user.password_hash if user else _dummy_hash(), password)
    if user is None or not user.active or not ok:
        throttle.failed(email, addr)
        return None
    throttle.succeeded(email)
    user.last_login_at = utcnow()
    db.session.commit()
    return user


@lru_cache(maxsize=1)
def _dummy_hash() -> str:
    return hash_password(secrets.token_urlsafe(16))


def user_for_session(session_id: str) -> User | None:
    """The user a session cookie names ("<id>.<epoch>"), while that epoch is current: a
    sign-out or a password change bumps it and ends every older session."""
    uid, _, epoch = str(session_id).partition(".")
    if row_id(uid) is None or not epoch.isdigit():
        return None
    user = db.session.get(User, row_id(uid))
    return user if user is not None and user.session_epoch == int(epoch) else None


def end_sessions(user: User) -> None:
    """End every session of ``user`` (the caller commits)."""
    user.session_epoch = (user.session_epoch or 0) + 1


def user_for_token(token: str, addr: str = "") -> User | None:
    """The active user of an admin token, or None; bad tokens count against the client
    address (TooManyAttempts once it is locked)."""
    throttle.check(None, addr)
    row = db.session.scalar(db.select(AdminToken).where(
        AdminToken.token_hash == token_hash(token), AdminToken.revoked_at.is_(None)))
    if row is None or not row.user.active:
        throttle.failed(None, addr)
        return None
    return row.user


def list_users(actor) -> list[User]:
    if not actor.can("user.manage"):
        raise Forbidden("only admins manage users")
    return list(db.session.scalars(db.select(User).order_by(User.email)))


def _clean_user(data: dict, *, creating: bool) -> dict:
    errors: dict[str, list[str]] = {}
    clean: dict = {}
    if creating or "email" in data:
        email = str(data.get("email") or "").strip().lower()
        if not _EMAIL.match(email):
            errors["email"] = ["must be an email address"]
        clean["email"] = email
    if creating or "role" in data:
        role = data.get("role") or "viewer"
        if role not in ROLES:
            errors["role"] = [f"must be one of {', '.join(ROLES)}"]
        clean["role"] = role
    if "tenant_id" in data:
        raw = data.get("tenant_id")
        tid = row_id(raw) if raw not in (None, "", 0, "0") else None
        if raw not in (None, "", 0, "0") and tid is None:
            errors["tenant_id"] = ["must be a tenant id"]
        if tid is not None and db.session.get(Tenant, tid) is None:
            errors["tenant_id"] = ["no such tenant"]
        clean["tenant_id"] = tid
    if creating or data.get("password"):
        pw = str(data.get("password") or "")
        problems = password_problems(pw)
        if problems:
            errors["password"] = problems
        clean["password"] = pw
    if "active" in data:
        clean["active"] = bool(data["active"]) if isinstance(data["active"], bool) else str(
            data["active"]).lower() in {"1", "true", "on", "y", "yes"}
    if errors:
        raise ValidationError("invalid user", errors)
    return clean


def create_user(actor, data: dict, *, bootstrap: bool = False) -> User:
    """Create a console user. ``bootstrap`` is for ``sluice init`` (no actor yet)."""
    if not bootstrap and (actor is None or not actor.can("user.manage")):
        raise Forbidden("only admins manage users")
    clean = _clean_user(data, creating=True)
    if db.session.scalar(db.select(User).where(User.email == clean["email"])):
        raise Conflict("a user with this email exists", {"email": ["is already taken"]})
    user = User(email=clean["email"], role=clean["role"], tenant_id=clean.get("tenant_id"),
                password_hash=hash_password(clean["password"]))
    db.session.add(user)
    db.session.flush()
    record(actor or user, "user.create", "user", user.id, tenant_id=user.tenant_id,
           after=user.to_dict())
    db.session.commit()
    return user


def update_user(actor, user_id: int, data: dict) -> User:
    if not actor.can("user.manage"):
        raise Forbidden("only admins manage users")
    user = db.session.get(User, user_id)
    if user is None:
        raise NotFound("no such user")
    clean = _clean_user(data, creating=False)
    if user.id == actor.id and (clean.get("role", "admin") != "admin" or
                                clean.get("active", True) is False):
        raise ValidationError("you cannot demote or deactivate yourself",
                              {"role": ["you cannot remove your own admin role"]})
    before = user.to_dict()
    if "password" in clean:
        user.password_hash = hash_password(clean.pop("password"))
        end_sessions(user)
    if "email" in clean and clean["email"] != user.email and db.session.scalar(
            db.select(User).where(User.email == clean["email"])):
        raise Conflict("a user with this email exists", {"email": ["is already taken"]})
    for k, v in clean.items():
        setattr(user, k, v)
    record(actor, "user.update", "user", user.id, tenant_id=user.tenant_id, before=before,
           after=user.to_dict())
    db.session.commit()
    return user


def create_admin_token(actor, name: str) -> tuple[AdminToken, str]:
    """A bearer token for the admin API, acting as ``actor``. Plaintext is returned once."""
    name = (name or "").strip() or "api"
    plaintext, prefix, digest = new_token(ADMIN_PREFIX)
    row = AdminToken(user_id=actor.id, name=name[:100], prefix=prefix, token_hash=digest)
    db.session.add(row)
    db.session.flush()
    record(actor, "admin_token.create", "admin_token", row.id, tenant_id=actor.tenant_id,
           after={"name": row.name, "prefix": row.prefix})
    db.session.commit()
    return row, plaintext


def revoke_admin_token(actor, token_id: int) -> AdminToken:
    row = db.session.get(AdminToken, token_id)
    if row is None or (row.user_id != actor.id and not actor.can("user.manage")):
        raise NotFound("no such token")
    if row.revoked_at is None:
        row.revoked_at = utcnow()
        record(actor, "admin_token.revoke", "admin_token", row.id, tenant_id=actor.tenant_id,
               after={"prefix": row.prefix})
        db.session.commit()
    return row


def list_admin_tokens(actor) -> list[AdminToken]:
    return list(db.session.scalars(db.select(AdminToken).where(
        AdminToken.user_id == actor.id).order_by(AdminToken.id.desc())))
