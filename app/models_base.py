"""Shared column helpers for models."""
from __future__ import annotations

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
