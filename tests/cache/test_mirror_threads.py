"""A bucket copy is read by lookups in worker threads while another thread's sync appends
to it: a reader sees whole rows, never arrays and a row count out of step."""
from __future__ import annotations

import threading

import numpy as np

from app.contract.cache.mirror import BucketCopy
from app.core.entities import entity_profile

PROFILE = entity_profile("write a short note").to_dict()


def test_candidates_while_rows_are_appended():
    copy = BucketCopy(b"g", 0)
    rng = np.random.default_rng(1)
    query = rng.standard_normal(64).astype(np.float32)
    query /= np.linalg.norm(query)
    errors: list[BaseException] = []
    done = threading.Event()

    def writer() -> None:
        try:
            for i in range(6000):  # grows the arrays many times (doubling from 16)
                copy.append([(f"r{i}", {"exp": 1e12, "profile": PROFILE}, query.copy())])
        finally:
            done.set()

    def reader() -> None:
        while not done.is_set():
            try:
                found = copy.candidates(query, 0.5, 0.0, lambda p: True)
                assert all(sim > 0.99 for _, sim in found)
                copy.has_live(0.0)
            except BaseException as exc:  # noqa: BLE001 - collected for the assertion
                errors.append(exc)
                return

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader)
                                                    for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert copy.rows == 6000 and len(copy.candidates(query, 0.5, 0.0, lambda p: True)) == 6000
