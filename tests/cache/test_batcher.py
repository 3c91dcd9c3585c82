"""The embedding micro-batcher: concurrent texts share encoder calls, owners are served
round-robin, a lone text is not held for company past its bound, a failing text fails only
its own request, and a cancelled request is not encoded.

The deterministic tests drive the batcher with an encoder whose first call blocks until the
test releases it, so what queues behind it (and how it is batched) is decided by the test,
not by timing. One test runs the real MiniLM encoder through it."""
from __future__ import annotations

import asyncio
import hashlib
import threading

import numpy as np
import pytest

from app.contract.cache import embedding
from app.contract.cache.batcher import EmbeddingBatcher

HANG_GUARD_S = 30  # only so a broken batcher fails the test instead of hanging it


def vec(text: str) -> np.ndarray:
    """A deterministic unit vector per text (what the gated encoder answers)."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")
    v = np.random.default_rng(seed).standard_normal(8).astype(np.float32)
    return v / np.linalg.norm(v)


class GatedEncoder:
    """Encodes like ``vec``; its first call waits for ``release()``. Records every call.
    Raises ValueError for any batch holding a text that starts with "poison"."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.entered = threading.Event()
        self._gate = threading.Event()

    def __call__(self, texts: list[str]) -> np.ndarray:
        self.calls.append(list(texts))
        if len(self.calls) == 1:
            self.entered.set()
            assert self._gate.wait(HANG_GUARD_S)
        if any(t.startswith("poison") for t in texts):
            raise ValueError("cannot encode poison")
        return np.stack([vec(t) for t in texts])

    def release(self) -> None:
        self._gate.set()


@pytest.fixture()
def gated():
    enc = GatedEncoder()
    batchers = []

    def make(**kw) -> EmbeddingBatcher:
        b = EmbeddingBatcher(enc, **kw)
        batchers.append(b)
        blocker = b.submit("blocker", owner="warm")  # occupies the worker until released
        assert enc.entered.wait(HANG_GUARD_S)
        make.blocker = blocker
        return b

    make.enc = enc
    yield make
    enc.release()
    for b in batchers:
        b.close()


def test_texts_queued_behind_a_running_batch_go_together(gated):
    batcher = gated(max_batch=32)
    futures = [batcher.submit(f"text {i}") for i in range(10)]
    gated.enc.release()
    got = [f.result(HANG_GUARD_S) for f in futures]
    assert gated.enc.calls[1:] == [[f"text {i}" for i in range(10)]]  # one call, arrival order
    for i, v in enumerate(got):
        assert np.array_equal(v, vec(f"text {i}"))
    assert batcher.stats.sizes == [1, 10]


def test_owners_are_served_round_robin_not_first_come_first_served(gated):
    """A tenant that queued 20 texts does not push another tenant's 2 texts behind them."""
    batcher = gated(max_batch=4)
    flood = [batcher.submit(f"a{i}", owner="tenant-a") for i in range(20)]
    late = [batcher.submit(f"b{i}", owner="tenant-b") for i in range(2)]
    gated.enc.release()
    for f in flood + late:
        f.result(HANG_GUARD_S)
    batches = gated.enc.calls[1:]
    assert batches[0] == ["a0", "b0", "a1", "b1"]  # tenant-b is in the very next batch
    flat = [t for b in batches for t in b]
    assert [t for t in flat if t.startswith("a")] == [f"a{i}" for i in range(20)]  # FIFO per owner
    assert all(len(b) <= 4 for b in batches)


def test_a_full_batch_goes_without_waiting_for_the_bound():
    """max_wait_s is an hour: the batch still goes the moment max_batch texts are queued
    (were the bound waited out, the guard below would fail the test)."""
    enc = GatedEncoder()
    enc.release()
    batcher = EmbeddingBatcher(enc, max_batch=3, max_wait_s=3600)
    try:
        futures = [batcher.submit(t) for t in ("x", "y", "z")]
        for f in futures:
            f.result(HANG_GUARD_S)
        assert enc.calls == [["x", "y", "z"]]
        assert batcher.stats.reasons == ["full"]
    finally:
        batcher.close()


def test_a_lone_text_goes_when_its_wait_runs_out():
    enc = GatedEncoder()
    enc.release()
    batcher = EmbeddingBatcher(enc, max_batch=8, max_wait_s=0.05)
    try:
        assert np.array_equal(batcher.embed("alone", timeout=HANG_GUARD_S), vec("alone"))
        assert enc.calls == [["alone"]] and batcher.stats.reasons == ["wait"]
    finally:
        batcher.close()


def test_without_a_wait_a_lone_text_goes_at_once():
    enc = GatedEncoder()
    enc.release()
    batcher = EmbeddingBatcher(enc, max_batch=8, max_wait_s=0.0)
    try:
        batcher.embed("alone", timeout=HANG_GUARD_S)
        assert batcher.stats.reasons == ["idle"]
    finally:
        batcher.close()


def test_a_failing_text_fails_only_its_own_request(gated):
    batcher = gated(max_batch=8)
    good = [batcher.submit(f"fine {i}") for i in range(3)]
    bad = batcher.submit("poison pill")
    more = [batcher.submit(f"fine {i}") for i in range(3, 6)]
    gated.enc.release()
    with pytest.raises(ValueError, match="poison"):
        bad.result(HANG_GUARD_S)
    for i, f in enumerate(good + more):
        assert np.array_equal(f.result(HANG_GUARD_S), vec(f"fine {i}"))
    assert batcher.stats.failed_batches == 1
    assert len(gated.enc.calls[1]) == 7 and all(len(c) == 1 for c in gated.enc.calls[2:])
    # the worker is still serving
    assert np.array_equal(batcher.embed("after", timeout=HANG_GUARD_S), vec("after"))


def test_an_encoder_that_loses_rows_fails_its_batch_instead_of_hanging_it():
    batcher = EmbeddingBatcher(lambda texts: np.zeros((len(texts) - 1, 8), np.float32),
                               max_batch=4)
    try:
        with pytest.raises(RuntimeError, match="0 vectors for 1 texts"):
            batcher.embed("x", timeout=HANG_GUARD_S)
    finally:
        batcher.close()


def test_a_cancelled_request_is_not_encoded_and_others_are_unaffected(gated):
    batcher = gated(max_batch=8)

    async def scenario():
        keep1 = asyncio.ensure_future(batcher.embed_async("keep 1"))
        drop = asyncio.ensure_future(batcher.embed_async("dropped"))
        keep2 = asyncio.ensure_future(batcher.embed_async("keep 2"))
        await asyncio.sleep(0)  # all three queued behind the blocker
        drop.cancel()
        await asyncio.sleep(0)
        gated.enc.release()
        return await keep1, await keep2, drop

    v1, v2, drop = asyncio.run(scenario())
    assert np.array_equal(v1, vec("keep 1")) and np.array_equal(v2, vec("keep 2"))
    assert drop.cancelled()
    assert "dropped" not in [t for b in gated.enc.calls for t in b]
    assert batcher.stats.cancelled == 1


def test_cancelling_a_request_whose_batch_is_running_leaves_the_batch_to_finish(gated):
    batcher = gated(max_batch=8)

    async def scenario():
        blocked = asyncio.wrap_future(gated.blocker)  # its batch is running
        waiter = asyncio.ensure_future(blocked)
        await asyncio.sleep(0)
        waiter.cancel()
        other = asyncio.ensure_future(batcher.embed_async("next"))
        await asyncio.sleep(0)
        gated.enc.release()
        return await other, waiter

    v, waiter = asyncio.run(scenario())
    assert waiter.cancelled() and np.array_equal(v, vec("next"))
    assert np.array_equal(gated.blocker.result(HANG_GUARD_S), vec("blocker"))


def test_closing_fails_what_is_still_queued(gated):
    batcher = gated(max_batch=8)
    queued = batcher.submit("never")
    threading.Timer(0.05, gated.enc.release).start()
    batcher.close()
    with pytest.raises(RuntimeError, match="closed"):
        queued.result(HANG_GUARD_S)
    with pytest.raises(RuntimeError, match="closed"):
        batcher.submit("late")


def test_real_minilm_vectors_through_the_batcher_equal_one_call_each():
    """Concurrent threads through the process's batcher get the same vectors the encoder
    gives each text alone (batching pads texts together; the mask keeps them apart)."""
    texts = [f"Where is my order number {i}, it was due last week?" if i % 2 else
             f"refund {i}" for i in range(24)]
    alone = np.stack([embedding.embed_many([t])[0] for t in texts])
    batcher = embedding.get_batcher()
    assert batcher is not None
    before = len(batcher.stats.sizes)
    out: dict[int, np.ndarray] = {}
    start = threading.Barrier(len(texts))

    def worker(i: int) -> None:
        start.wait(HANG_GUARD_S)
        out[i] = embedding.embed(texts[i], owner=i % 3)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(texts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG_GUARD_S)
    got = np.stack([out[i] for i in range(len(texts))])
    assert ((got * alone).sum(axis=1) >= 0.99999).all()
    sizes = batcher.stats.sizes[before:]
    assert sum(sizes) == len(texts)
