"""Shared column helpers for models."""
from __future__ import annotations

from typing import Any

from datetime import datetime, timezone

from sqlalchemy import DateTime, types


def utcnow() -> datetime:
    """Called per row (pass the function, never its result, as a default)."""
    return datetime.now(timezone.utc)


class UTCDateTime(types.TypeDecorator):
    """Timezone-aware UTC datetimes on every backend (SQLite drops tzinfo)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is not None:
            if value.tzinfo is None:
                value = value.replace(tzinfo=timezone.utc)
            value = value.astimezone(timezone.utc)
        return value

    def process_result_value(self, value, dialect):
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return value


ROW_ID_MAX = 2**31 - 1   # id columns are INTEGER


def row_id(value: Any) -> int | None:
    """``value`` as a row id (a whole number in 1 .. 2**31 - 1), else None: what a
    service looks up instead of passing client input to the database, where an id out of
    the column's range is an error, not a missing row."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        value = value.strip()
        if not value.isdigit() or len(value) > 10:
            return None
    try:
        n = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if isinstance(value, float) and value != n:
        return None
    return n if 1 <= n <= ROW_ID_MAX else None
