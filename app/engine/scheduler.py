"""One worker thread runs every model forward, in arrival order; the queue in front of it
is what /metrics reports as waiting."""
from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable

from app.contract import heap
from app.engine.core import Engine, Job

log = logging.getLogger(__name__)


class Scheduler:
    def __init__(self) -> None:
        self.engine: Engine | None = None
        self.error: str = ""
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._waiting: list[Job] = []
        self._running: Job | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self, load: Callable[[], Engine]) -> None:
        """Load the engine on the worker thread, then serve the queue."""
        self._thread = threading.Thread(target=self._main, args=(load,), name="engine",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._queue.put(None)

    @property
    def healthy(self) -> bool:
        return self.engine is not None and not self.error

    def stats(self) -> dict[str, Any]:
        with self._lock:
            running = [self._running] if self._running else []
            return {"running": len(running), "waiting": len(self._waiting),
                    "running_models": [j.model for j in running],
                    "waiting_models": [j.model for j in self._waiting]}

    def submit(self, job: Job) -> None:
        with self._lock:
            self._waiting.append(job)
        self._queue.put(job)

    def call(self, fn: Callable[[Engine], Any]) -> Future:
        """Run ``fn(engine)`` on the worker thread between requests (adapter changes)."""
        fut: Future = Future()
        self._queue.put((fn, fut))
        return fut

    def _main(self, load: Callable[[], Engine]) -> None:
        try:
            self.engine = load()
        except Exception as exc:  # noqa: BLE001 - reported by /health
            log.exception("engine failed to load")
            self.error = f"load failed: {exc}"
            return
        heap.settle("the model")
        while not self._stop.is_set():
            item = self._queue.get()
            if item is None:
                break
            if isinstance(item, tuple):
                fn, fut = item
                try:
                    fut.set_result(fn(self.engine))
                except Exception as exc:  # noqa: BLE001 - returned to the caller
                    fut.set_exception(exc)
                heap.settle_if_grown()     # an adapter loaded
                continue
            self._run(item)

    def _run(self, job: Job) -> None:
        with self._lock:
            self._waiting.remove(job)
            self._running = job
        try:
            self.engine.run(job)
        except Exception as exc:  # noqa: BLE001 - request errors become an error event
            from app.engine.core import EngineError
            job.emit(("error", str(exc)))
            if not isinstance(exc, EngineError):
                # Like vLLM's EngineDeadError: /health turns 503 and the supervisor restarts us.
                log.exception("generation failed")
                self.error = f"engine failed: {exc}"
        finally:
            with self._lock:
                self._running = None
