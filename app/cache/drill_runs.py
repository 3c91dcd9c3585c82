"""Drill CD-28A (cache poisoning) as a recorded DrillRun, for the CLI, the console and the
admin API. ``record_cache_poisoning`` parses the pair file, records the run and runs
``app.cache.drill.run_cache_poisoning`` on the production store and key builder."""
from __future__ import annotations

from typing import Iterable

from flask import current_app

from app.cache.drill import drill_passed, read_pairs, run_cache_poisoning
from app.contract.cache.embedding import configure_from
from app.drills.models import DrillRun
from app.drills.service import finish_run, require_drill_run, start_run
from app.redis_client import get_redis

KIND = "cache-poisoning"


def record_cache_poisoning(lines: Iterable[str], *, threshold: float | None = None,
                           source: str = "", actor=None, verified: bool = True) -> DrillRun:
    """Parse, record and run; returns the finished run ("passed": no false hit, or
    "failed"; its ``result`` is the drill's report). Raises PairError on a bad file
    (nothing recorded then); an exception of the drill itself finishes the run as "error"
    and propagates."""
    require_drill_run(actor)
    pairs = read_pairs(lines)
    configure_from(current_app.config)
    run = start_run(KIND, {"source": source, "threshold": threshold, "pairs": len(pairs),
                           "verified": verified}, actor=actor)
    try:
        result = run_cache_poisoning(pairs, get_redis(), current_app.config["REDIS_NAMESPACE"],
                                     threshold, verified=verified)
    except Exception as exc:
        finish_run(run, {}, passed=None, error=f"{type(exc).__name__}: {exc}")
        raise
    return finish_run(run, result, passed=drill_passed(result))
