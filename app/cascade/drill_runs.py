"""Drill CD-28B (domain shift) as a recorded DrillRun: the CLI and the drills worker both
call ``record_domain_shift``, which validates, records the run and runs
``app.cascade.drill.run_domain_shift`` against a gateway."""
from __future__ import annotations

import time
from typing import Callable
from urllib.parse import urlparse

from app.cascade.drill import drill_passed, run_domain_shift
from app.drills.models import DrillRun
from app.drills.service import finish_run, start_run
from app.errors import ValidationError

KIND = "domain-shift"
MAX_REQUESTS = 500


def ledger_lookup(wait_s: float) -> Callable[[list[dict]], None]:
    """Fill ``escalated`` from the ledger rows of the drill's request ids (bounded wait),
    for gateways that send no ``x-sluice-escalated`` header."""
    from app.extensions import db
    from app.ledger.models import LedgerEntry

    def lookup(rows: list[dict]) -> None:
        pending = {r["request_id"]: r for r in rows if r.get("request_id")}
        deadline = time.monotonic() + wait_s
        while pending:
            found = db.session.execute(db.select(LedgerEntry.request_id, LedgerEntry.escalated)
                                       .where(LedgerEntry.request_id.in_(list(pending)))).all()
            for rid, escalated in found:
                pending.pop(rid)["escalated"] = bool(escalated)
            db.session.rollback()
            if not pending or time.monotonic() >= deadline:
                return
            time.sleep(0.5)
    return lookup


def _validate(url: str, key: str, n_ood: int, n_control: int, max_tokens: int,
              min_escalation_rate: float) -> None:
    errors: dict[str, list[str]] = {}
    parsed = urlparse(url or "")
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        errors["url"] = ["must be the gateway's http(s) base URL"]
    if not key:
        errors["key"] = ["a tenant API key is required"]
    if not 1 <= n_ood <= MAX_REQUESTS:
        errors["n_ood"] = [f"must be between 1 and {MAX_REQUESTS}"]
    if not 0 <= n_control <= MAX_REQUESTS:
        errors["n_control"] = [f"must be between 0 and {MAX_REQUESTS}"]
    if not 1 <= max_tokens <= 4096:
        errors["max_tokens"] = ["must be between 1 and 4096"]
    if not 0.0 <= min_escalation_rate <= 1.0:
        errors["min_escalation_rate"] = ["must be between 0 and 1"]
    if errors:
        raise ValidationError("invalid domain-shift drill", errors)


def record_domain_shift(url: str, key: str, *, workflow: str = "drill-simple-extraction",
                        n_ood: int = 40, n_control: int = 20, max_tokens: int = 64,
                        timeout_s: float = 120.0, ledger_wait_s: float = 15.0,
                        min_escalation_rate: float = 0.5, seed: int = 0,
                        unmonitored_tier: str | None = None,
                        reference_tier: str | None = None, actor=None) -> DrillRun:
    """Run CD-28B against the gateway at ``url`` with tenant key ``key`` and return the
    finished run: status "passed" (no aborted-tier byte reached a client, no request
    failed, out-of-domain escalation rate >= ``min_escalation_rate``), "failed", or
    "error" (the drill itself broke; ``result["error"]`` says how). Raises
    ValidationError on bad parameters (nothing is recorded then). The key is never stored."""
    _validate(url, key, n_ood, n_control, max_tokens, min_escalation_rate)
    if bool(unmonitored_tier) != bool(reference_tier):
        raise ValidationError("invalid domain-shift drill", {"reference_tier": [
            "task accuracy needs both the unmonitored tier and the reference tier"]})
    params = {"url": url, "workflow": workflow, "n_ood": n_ood, "n_control": n_control,
              "max_tokens": max_tokens, "min_escalation_rate": min_escalation_rate,
              "seed": seed, **({"unmonitored_tier": unmonitored_tier,
                                "reference_tier": reference_tier} if reference_tier else {})}
    run = start_run(KIND, params, actor=actor)
    try:
        result = run_domain_shift(url, key, n_ood=n_ood, n_control=n_control,
                                  workflow=workflow, max_tokens=max_tokens,
                                  timeout_s=timeout_s, seed=seed,
                                  escalation_lookup=ledger_lookup(ledger_wait_s),
                                  unmonitored_tier=unmonitored_tier,
                                  reference_tier=reference_tier)
    except Exception as exc:  # noqa: BLE001 - the run records what went wrong
        return finish_run(run, {}, passed=None, error=f"{type(exc).__name__}: {exc}"[:500])
    return finish_run(run, result, passed=drill_passed(result, min_escalation_rate))
