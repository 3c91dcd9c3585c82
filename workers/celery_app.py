"""Celery wired per Flask's pattern: tasks run inside the app context.

``celery -A workers.celery_app worker`` finds ``celery`` here. The Flask app is built
lazily on first attribute access by Celery's CLI, never at import of a task module.
"""
from __future__ import annotations

from celery import Celery


def make_celery() -> Celery:
    from app.factory import create_app
    return create_app().extensions["celery"]


def __getattr__(name: str):
    # Celery's CLI looks up ``celery`` (or ``app``) on this module.
    if name in ("celery", "app"):
        return make_celery()
    raise AttributeError(name)
