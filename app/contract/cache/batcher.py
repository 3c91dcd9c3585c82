"""Dynamic micro-batching of embeddings across concurrent requests.

One ONNX call for 32 short texts costs about half of 32 calls for one (the model's fixed
per-call work is paid once), so a gateway under load embeds what its concurrent requests
ask for together. A single worker thread owns the encoder:

- Requests queue per ``owner`` (the tenant), and a batch takes them round-robin across
  owners, oldest first within each: a tenant that floods the queue delays its own texts,
  not another tenant's (each owner with queued texts gets a place in every batch).
- A batch goes as soon as it is full (``max_batch``) or the oldest queued text has waited
  ``max_wait_s``; with ``max_wait_s`` 0 a batch is whatever queued while the last one ran,
  so a lone request is never held back waiting for company.
- A batch whose encode fails is retried one text at a time, so a text the encoder cannot
  take fails only its own request; other batches never see the error.
- A request cancelled while queued is dropped before it is encoded; one cancelled while its
  batch runs leaves the batch to finish for the others.

``embed`` blocks (callable from any thread); ``embed_async`` awaits without holding one.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Sequence

import numpy as np

log = logging.getLogger(__name__)


@dataclass
class BatchStats:
    """What the batcher did, for benches and tests: batch sizes in dispatch order and why
    each went (``full``, ``wait``: the oldest text's wait ran out, ``idle``: nothing more
    was queued and no wait was asked)."""
    sizes: list[int] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    texts: int = 0
    failed_batches: int = 0
    cancelled: int = 0

    def note(self, size: int, reason: str) -> None:
        if len(self.sizes) < 10_000:  # a bounded record: benches read it, nothing relies on it all
            self.sizes.append(size)
            self.reasons.append(reason)
        self.texts += size


class _Item:
    __slots__ = ("text", "future", "queued_at")

    def __init__(self, text: str, queued_at: float) -> None:
        self.text = text
        self.future: Future = Future()
        self.queued_at = queued_at


class EmbeddingBatcher:
    """Batches ``encode(texts) -> (n, d) float32`` calls made by concurrent requests."""

    def __init__(self, encode: Callable[[list[str]], np.ndarray], *, max_batch: int = 32,
                 max_wait_s: float = 0.0, name: str = "embedding-batcher") -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.encode = encode
        self.max_batch = int(max_batch)
        self.max_wait_s = max(0.0, float(max_wait_s))
        self.stats = BatchStats()
        self._queues: OrderedDict[Hashable, deque[_Item]] = OrderedDict()
        self._queued = 0
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # ---- submitting ---------------------------------------------------------------------
    def submit(self, text: str, owner: Hashable = None) -> Future:
        """Queue ``text``; the future gets its (d,) vector or the encoder's exception."""
        item = _Item(text, time.monotonic())
        with self._cond:
            if self._closed:
                raise RuntimeError("embedding batcher is closed")
            q = self._queues.get(owner)
            if q is None:
                q = self._queues[owner] = deque()
            q.append(item)
            self._queued += 1
            self._cond.notify()
        return item.future

    def embed(self, text: str, owner: Hashable = None, timeout: float | None = None) -> np.ndarray:
        """Blocking: the vector for ``text`` (raises what the encoder raised for it)."""
        return self.submit(text, owner).result(timeout)

    async def embed_async(self, text: str, owner: Hashable = None) -> np.ndarray:
        """Awaits the vector; cancelling the await withdraws a text not yet in a batch."""
        return await asyncio.wrap_future(self.submit(text, owner))

    def close(self) -> None:
        """Stop the worker after the batch in progress; queued texts fail."""
        with self._cond:
            self._closed = True
            left = [it for q in self._queues.values() for it in q]
            self._queues.clear()
            self._queued = 0
            self._cond.notify_all()
        for it in left:
            if it.future.set_running_or_notify_cancel():
                it.future.set_exception(RuntimeError("embedding batcher closed"))
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)

    # ---- the worker ---------------------------------------------------------------------
    def _take(self) -> tuple[list[_Item], str] | None:
        """Wait for work, then a batch: round-robin over owners, oldest first in each."""
        with self._cond:
            while not self._queued and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            reason = "idle"
            if self.max_wait_s and self._queued < self.max_batch:
                deadline = min(q[0].queued_at for q in self._queues.values()) + self.max_wait_s
                while self._queued < self.max_batch and not self._closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        reason = "wait"
                        break
                    self._cond.wait(left)
                if self._closed:
                    return None
            if self._queued >= self.max_batch:
                reason = "full"
            batch: list[_Item] = []
            while len(batch) < self.max_batch and self._queues:
                for owner in list(self._queues):
                    q = self._queues[owner]
                    batch.append(q.popleft())
                    if not q:
                        del self._queues[owner]
                    else:  # this owner goes to the back of the rotation
                        self._queues.move_to_end(owner)
                    if len(batch) == self.max_batch:
                        break
            self._queued -= len(batch)
        return batch, reason

    def _run(self) -> None:
        while True:
            taken = self._take()
            if taken is None:
                return
            batch, reason = taken
            live = [it for it in batch if it.future.set_running_or_notify_cancel()]
            self.stats.cancelled += len(batch) - len(live)
            if not live:
                continue
            self.stats.note(len(live), reason)
            self._encode(live)

    def _encode(self, items: Sequence[_Item]) -> None:
        try:
            vecs = self.encode([it.text for it in items])
        except BaseException as exc:  # noqa: BLE001 - delivered to the requests, never raised here
            self.stats.failed_batches += 1
            if len(items) == 1:
                items[0].future.set_exception(exc)
                return
            log.warning("embedding batch of %d failed (%s); encoding its texts one by one",
                        len(items), exc)
            for it in items:
                self._encode_one(it)
            return
        if len(vecs) != len(items):
            exc = RuntimeError(f"encoder returned {len(vecs)} vectors for {len(items)} texts")
            for it in items:
                it.future.set_exception(exc)
            return
        for it, vec in zip(items, vecs):
            it.future.set_result(vec)

    def _encode_one(self, item: _Item) -> None:
        try:
            item.future.set_result(self.encode([item.text])[0])
        except BaseException as exc:  # noqa: BLE001
            item.future.set_exception(exc)


def stats_summary(stats: BatchStats) -> dict[str, Any]:
    sizes = stats.sizes or [0]
    return {"batches": len(stats.sizes), "texts": stats.texts,
            "mean_batch": round(stats.texts / max(1, len(stats.sizes)), 2),
            "max_batch": max(sizes), "failed_batches": stats.failed_batches,
            "cancelled": stats.cancelled}
