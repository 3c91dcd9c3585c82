"""Run a server for tests on a port the OS picks; prints ``PORT <n>`` once listening.

    python -m tests.gateway.serve fake <name>
    python -m tests.gateway.serve gateway '<config overrides json>'
"""
from __future__ import annotations

import json
import socket
import sys

import uvicorn


def main() -> None:
    kind, arg = sys.argv[1], sys.argv[2]
    if kind == "fake":
        from tests.gateway.fake_upstream import create_fake
        app = create_fake(arg)
    else:
        from app.gateway.asgi import create_gateway
        from config import load_config
        app = create_gateway(load_config("test", overrides=json.loads(arg)))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on",
                                           access_log=False))
    port = sock.getsockname()[1]

    orig_startup = server.startup

    async def startup(sockets=None):
        await orig_startup(sockets=sockets)
        print(f"PORT {port}", flush=True)

    server.startup = startup
    server.run(sockets=[sock])


if __name__ == "__main__":
    main()
