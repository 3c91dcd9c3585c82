"""Run ``drain_stream`` in its own process, for crash tests.

    python -m tests.ledger.drain_proc '<app config json>' <mode> <batch_size>

mode ``crash-after-commit``: SIGKILL itself after the first batch committed, before the
ack. mode ``slow``: drain everything in small batches (the parent kills it at some point).
"""
from __future__ import annotations

import json
import os
import signal
import sys


def main() -> None:
    from app.factory import create_app
    from app.ledger.service import drain_stream
    config, mode, batch = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    app = create_app(config, env="test")

    def crash(ids):
        os.kill(os.getpid(), signal.SIGKILL)

    with app.app_context():
        print("READY", flush=True)
        drain_stream(max_batches=100_000, batch_size=batch,
                     on_committed=crash if mode == "crash-after-commit" else None)


if __name__ == "__main__":
    main()
