"""A long-lived process's heap and Python's cyclic garbage collector (the gateway, the
reference engine).

What a gateway process loads once (torch and xgrammar for the grammar compiler, the
embedding encoder, the pool models' tokenizers) is about a million objects that live as
long as the process; the reference engine loads torch and its model, a heap of the same
kind. A full collection walks all of them: in the gateway 170-435 ms with the event loop
stopped, every 1-3 s at 32 connections on a pool tier (gc callbacks on the gateway under
bench/gateway_overhead.py), which made p99 there ~8x p50 (bench/results/
gateway_overhead.txt: 216-219 ms before, 28-38 ms after). ``settle`` runs one collection
after such a load and then ``gc.freeze()``s every object alive, so later collections walk
only what requests allocate since. Frozen objects are still freed by reference counting
(an evicted cache entry goes as before); only a reference cycle that was alive at the
freeze and dies later is never collected, which is why ``settle`` runs after loads, not on
a timer. At exit the heap is unfrozen, so the interpreter's last collections run over
everything as they would have (a frozen cycle left at exit makes nanobind-bound modules
report "leaked instances").
"""
from __future__ import annotations

import atexit
import gc
import logging
import sys
import threading
import time

log = logging.getLogger(__name__)

# pymalloc blocks allocated since the last settle that mean a load happened on first use
# (a tokenizer is ~300k objects; the caches' steady state is far below this)
GROWTH_BLOCKS = 250_000

_lock = threading.Lock()
_settled = {"blocks": 0, "count": 0}


def settle(what: str) -> None:
    """Collect once, then freeze everything alive now (after loading ``what``)."""
    with _lock:
        t0 = time.perf_counter()
        gc.collect()
        gc.freeze()
        _settled["blocks"] = sys.getallocatedblocks()
        if not _settled["count"]:
            atexit.register(gc.unfreeze)
        _settled["count"] += 1
    log.info("heap settled after %s: %d objects frozen, %.0f ms", what,
             gc.get_freeze_count(), (time.perf_counter() - t0) * 1000)


def settle_if_grown() -> bool:
    """``settle`` when the heap grew by a load since the last one (a model or tokenizer
    loaded on first use); a check of one counter otherwise."""
    if sys.getallocatedblocks() - _settled["blocks"] < GROWTH_BLOCKS:
        return False
    settle("a load on first use")
    return True


def then_settle(load, what: str):
    """``load`` followed by ``settle(what)``: a warm-up thread's target."""
    def run() -> None:
        try:
            load()
        finally:
            settle(what)
    return run
