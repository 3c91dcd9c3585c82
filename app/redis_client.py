"""One Redis client per app, with every key under the configured namespace."""
from __future__ import annotations

import redis
from flask import Flask, current_app

from app.contract.keys import Keys


def init_redis(app: Flask) -> None:
    client = redis.Redis.from_url(app.config["REDIS_URL"], socket_timeout=2,
                                  socket_connect_timeout=2, health_check_interval=30)
    app.extensions["redis"] = client
    app.extensions["redis_keys"] = Keys(app.config["REDIS_NAMESPACE"])


def get_redis() -> redis.Redis:
    return current_app.extensions["redis"]


def keys() -> Keys:
    return current_app.extensions["redis_keys"]
