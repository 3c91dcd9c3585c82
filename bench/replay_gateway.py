"""The replay's gateway app with config overrides (gunicorn factory): the stack's own
config from the environment, then ``overrides`` (a JSON object) on top. bench/replay.py's
full_adapters variant raises the off-path in-flight caps with it (stated there)."""
from __future__ import annotations

import json


def create(overrides: str = "{}"):
    from app.gateway.asgi import create_gateway
    from config import load_config
    return create_gateway(load_config(overrides=json.loads(overrides)))
