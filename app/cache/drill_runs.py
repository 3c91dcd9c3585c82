"""Running the cache drill as a recorded DrillRun (CLI and console share this)."""
from __future__ import annotations

from typing import Iterable

from flask import current_app

from app.cache.drill import drill_passed, read_pairs, run_cache_poisoning
from app.contract.cache.embedding import configure_from
from app.drills.service import finish_run, start_run
from app.redis_client import get_redis


def run_drill_file(lines: Iterable[str], *, threshold: float | None = None, source: str = "",
                   actor=None) -> dict:
    """Parse, run and record; raises PairError on a bad file (nothing recorded then)."""
    from app.drills.service import require_drill_run
    require_drill_run(actor)
    pairs = read_pairs(lines)
    configure_from(current_app.config)
    run = start_run("cache-poisoning", {"source": source, "threshold": threshold,
                                        "pairs": len(pairs)}, actor=actor)
    try:
        result = run_cache_poisoning(pairs, get_redis(), current_app.config["REDIS_NAMESPACE"],
                                     threshold)
    except Exception as exc:
        finish_run(run, {}, passed=None, error=f"{type(exc).__name__}: {exc}")
        raise
    finish_run(run, result, passed=drill_passed(result))
    return {**result, "run_id": run.id}
