"""Secrets: password hashing (argon2) and high-entropy tokens stored as SHA-256."""
from __future__ import annotations

import hashlib
import re
import secrets

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

_ph = PasswordHasher()

KEY_PREFIX = "sk-sl-"
ADMIN_PREFIX = "sla-"


def hash_password(password: str) -> str:
    return _ph.hash(password)


def verify_password(hashed: str, password: str) -> bool:
    try:
        return _ph.verify(hashed, password)
    except (VerificationError, InvalidHashError):
        return False


COMMON = {"password", "12345678", "123456789", "qwertyuiop", "letmein123", "admin1234",
          "password1", "iloveyou1", "sluice123", "changeme1"}


def password_problems(password: str) -> list[str]:
    """Why a password is too weak (empty list: acceptable)."""
    problems = []
    if len(password) < 10:
        problems.append("must be at least 10 characters")
    if password.lower() in COMMON or len(set(password)) < 5:
        problems.append("is too common or repetitive")
    classes = sum(bool(re.search(p, password)) for p in (r"[a-z]", r"[A-Z]", r"\d", r"[^\w]"))
    if classes < 2:
        problems.append("must mix at least two of: lower case, upper case, digits, symbols")
    return problems


def token_hash(token: str) -> str:
    """Keys are 192-bit random, so a fast unsalted hash is safe and lets the gateway look
    them up in O(1) without a slow KDF on the hot path."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token(prefix: str) -> tuple[str, str, str]:
    """Return (plaintext, visible prefix, hash). Show the plaintext once, store the rest."""
    raw = prefix + secrets.token_urlsafe(24)
    return raw, raw[: len(prefix) + 6], token_hash(raw)
