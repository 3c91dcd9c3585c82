"""A process's heap: what it loads once is frozen out of the collector's full
passes (app.contract.heap), so a full collection walks only what requests allocate."""
import gc

import pytest

from app.contract import heap


def test_a_settled_load_is_left_out_of_full_collections():
    loaded = [{"piece": i, "ids": [i, i + 1]} for i in range(200_000)]   # a "tokenizer"
    probe = loaded[12345]

    def walked() -> set[int]:      # what a full collection walks
        return {id(o) for o in gc.get_objects()}
    assert id(probe) in walked()
    before = gc.get_freeze_count()
    heap.settle("a test load")
    assert gc.get_freeze_count() >= before + len(loaded)
    assert id(probe) not in walked()
    # objects made after the settle are collected as before
    later = {"made": ["after"]}
    assert id(later) in walked()


def test_the_heap_settles_again_only_after_a_load():
    heap.settle("baseline")
    count = heap._settled["count"]
    small = [object() for _ in range(1000)]
    assert heap.settle_if_grown() is False
    big = [[i] for i in range(heap.GROWTH_BLOCKS + 50_000)]     # one block per list
    assert heap.settle_if_grown() is True
    assert heap._settled["count"] == count + 1
    assert heap.settle_if_grown() is False
    del small, big


def test_a_warm_up_settles_even_when_it_fails():
    count = heap._settled["count"]

    def broken():
        raise RuntimeError("no model")
    with pytest.raises(RuntimeError, match="no model"):   # the failure still reaches the log
        heap.then_settle(broken, "a broken warm-up")()
    assert heap._settled["count"] == count + 1
