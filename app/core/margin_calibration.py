"""γ calibration for S04's logprob-margin monitor (issue 24). Pure.

The monitor escalates an answer whose mean margin is below γ, so as a detector of wrong
answers, "positive" = escalated, and on labelled traces (margin, answer correct?):

- recall(γ)    = wrong answers escalated / wrong answers: never falls as γ rises;
- precision(γ) = wrong answers among the escalated ones;
- escalation rate(γ) = share escalated (what the net costs: each one pays a second tier).

``fit_gamma`` picks γ for a target: for recall, the smallest γ whose recall reaches it
(the fewest escalations that catch that share of the wrong answers); for precision, the
largest γ whose precision still reaches it (the most wrong answers caught while at least
that share of what is escalated is wrong). So a higher recall target never lowers γ, and a
higher precision target never raises it.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

KINDS = ("recall", "precision")
DIGITS = 4  # γ is stored and shown to 4 decimals


def labelled(traces: Iterable[tuple[Any, Any]]) -> tuple[list[float], list[bool]]:
    """(margins, correct) of the traces whose margin is a finite number and whose label is
    a bool; anything else is left out."""
    margins, correct = [], []
    for m, ok in traces:
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not math.isfinite(m):
            continue
        if not isinstance(ok, bool):
            continue
        margins.append(float(m))
        correct.append(ok)
    return margins, correct


def candidates(margins: Sequence[float]) -> list[float]:
    """Every γ that escalates a different set: 0 (none, margins are >= 0), and just above
    each distinct margin (that margin and every lower one escalate)."""
    step = 10 ** -DIGITS
    out = {0.0}
    for m in margins:
        out.add(round(math.floor(m / step + 1) * step, DIGITS))
    return sorted(out)


def point(margins: Sequence[float], correct: Sequence[bool], gamma: float) -> dict[str, Any]:
    n = len(margins)
    wrong = sum(not c for c in correct)
    esc = [m < gamma for m in margins]
    n_esc = sum(esc)
    caught = sum(e and not c for e, c in zip(esc, correct))
    kept = [c for e, c in zip(esc, correct) if not e]
    return {"gamma": round(gamma, DIGITS), "escalated": n_esc,
            "escalation_rate": n_esc / n if n else 0.0,
            "recall": caught / wrong if wrong else 0.0,
            "precision": caught / n_esc if n_esc else None,
            "kept_accuracy": sum(kept) / len(kept) if kept else None,
            # served answers right: a kept one as judged, an escalated one taken as right
            # (the next tier's answer is assumed right, an upper bound on the net's gain)
            "accuracy_with_escalation_ceiling": (sum(kept) + n_esc) / n if n else None}


def curve(margins: Sequence[float], correct: Sequence[bool]) -> list[dict[str, Any]]:
    """One point per candidate γ, ascending."""
    return [point(margins, correct, g) for g in candidates(margins)]


def fit_gamma(margins: Sequence[float], correct: Sequence[bool], kind: str, target: float
              ) -> dict[str, Any]:
    """The γ for ``target`` recall or precision (see the module docstring), with its point
    on the curve, the curve itself, and ``reason`` when no γ meets the target (then
    ``gamma`` is None)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}")
    if not 0.0 < target <= 1.0:
        raise ValueError("target must be in (0, 1]")
    pts = curve(margins, correct)
    base = {"kind": kind, "target": target, "n": len(margins),
            "wrong": sum(not c for c in correct), "curve": pts}
    if not base["wrong"]:
        return {**base, "gamma": None, "point": None,
                "reason": "no wrong answer among the labelled traces: nothing to catch"}
    if kind == "recall":
        ok = [p for p in pts if p["recall"] >= target - 1e-12]
        chosen = ok[0] if ok else None
    else:
        ok = [p for p in pts if p["precision"] is not None and p["precision"] >= target - 1e-12]
        chosen = ok[-1] if ok else None
    if chosen is None:
        return {**base, "gamma": None, "point": None,
                "reason": f"no γ reaches {kind} {target:.0%} on these traces"}
    return {**base, "gamma": chosen["gamma"], "point": chosen, "reason": ""}
