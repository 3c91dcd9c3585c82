"""The semantic cache's error bound, learned online per tenant (issue 22). Pure.

A reworded question the verifier (``app.core.cache_verify``) judges the same as a cached one
is served only at or above the tenant's *line*, a cosine learned from evidence:

- *observations*: (cosine, whether the answers agreed). They come for free from misses (a
  candidate that was not served: the fresh answer is compared with the cached one), and
  from a sampled share of the hits the verifier serves, generated again upstream in the
  background (the client still gets the cached answer) and compared the same way.
- the line is the lowest cosine ``t`` at which the observations at or above ``t``, pooled,
  hold the tenant's ``cache_error_bound`` at 95% confidence (Wilson upper bound); with too
  few observations anywhere, the verified path stays closed (the line is the fast line:
  only word-for-word matches above the static threshold are served, as before).
- every entry has its own threshold as well: the line, or lower where the entry's own
  agreements alone hold the bound (``entry_threshold``: as many as the line would need, so
  at a 0.1% bound in practice never). An entry that disagrees is evicted.

So a tenant's rewordings start as misses (each one an observation), the line comes down as
agreeing evidence piles up, and goes back up as soon as wrong answers show: the measured
error of what was served stays under the bound while the line is learned.
"""
from __future__ import annotations

import difflib
import functools
import json
import math
from dataclasses import dataclass, field

# Observation bins: lower edges of cosine ranges (the last bin runs to 1.0).
EDGES = (0.70, 0.75, 0.80, 0.85, 0.88, 0.91, 0.94, 0.97)
Z95 = 1.959964


def wilson_upper(wrong: int, n: int, z: float = Z95) -> float:
    """Upper end of the Wilson score interval of an error rate (1.0 with no data)."""
    if n <= 0:
        return 1.0
    p = wrong / n
    den = 1 + z * z / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return min(1.0, (centre + spread) / den)


def wilson_lower(wrong: int, n: int, z: float = Z95) -> float:
    if n <= 0:
        return 0.0
    p = wrong / n
    den = 1 + z * z / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (centre - spread) / den)


def bin_of(similarity: float) -> int:
    """Index of the bin ``similarity`` falls in (-1 below the first edge)."""
    i = -1
    for j, edge in enumerate(EDGES):
        if similarity >= edge:
            i = j
    return i


@dataclass
class Evidence:
    """One tenant's observations, per bin: how many, and how many disagreed."""
    n: list[int] = field(default_factory=lambda: [0] * len(EDGES))
    wrong: list[int] = field(default_factory=lambda: [0] * len(EDGES))

    def add(self, similarity: float, agreed: bool) -> None:
        i = bin_of(similarity)
        if i < 0:
            return
        self.n[i] += 1
        self.wrong[i] += 0 if agreed else 1

    def line(self, bound: float, floor: float, fast_line: float) -> float:
        """The lowest bin edge >= ``floor`` whose pooled evidence from there up holds
        ``bound``; ``fast_line`` when none does."""
        best = fast_line
        n = wrong = 0
        for i in range(len(EDGES) - 1, -1, -1):
            n += self.n[i]
            wrong += self.wrong[i]
            if EDGES[i] + 1e-9 < floor:
                break
            if wilson_upper(wrong, n) <= bound:
                best = min(best, EDGES[i])
        return best

    def measured(self, above: float = 0.0) -> tuple[int, int, float, float, float]:
        """(observations, wrong, error rate, 95% low, 95% high) at or above ``above``."""
        n = sum(c for e, c in zip(EDGES, self.n) if e + 1e-9 >= above)
        k = sum(c for e, c in zip(EDGES, self.wrong) if e + 1e-9 >= above)
        return n, k, (k / n if n else 0.0), wilson_lower(k, n), wilson_upper(k, n)

    def to_fields(self) -> dict[str, int]:
        out = {}
        for i in range(len(EDGES)):
            out[f"n{i}"], out[f"w{i}"] = self.n[i], self.wrong[i]
        return out

    @classmethod
    def from_fields(cls, fields: dict) -> "Evidence":
        ev = cls()
        for i in range(len(EDGES)):
            ev.n[i] = int(fields.get(f"n{i}", 0) or 0)
            ev.wrong[i] = int(fields.get(f"w{i}", 0) or 0)
        return ev


@functools.lru_cache(maxsize=64)   # per lookup in the gateway; a tenant's bound rarely changes
def min_observations(bound: float) -> int:
    """Agreeing observations (none wrong) needed before ``bound`` holds at 95%."""
    n = 1
    while wilson_upper(0, n) > bound and n < 10**7:
        n = int(n * 1.2) + 1
    return n


# An entry keeps the cosines of its highest agreements, up to this many: a bound that needs
# more agreeing evidence than that (0.1% needs ~3,800) never lets one entry below its line.
ENTRY_AGREEMENTS_KEPT = 64


def entry_threshold(tenant_line: float, agreed: list[float] | None, floor: float,
                    needed: int | None) -> float:
    """An entry serves at or above the tenant's line, or lower on its own evidence only:
    down to the cosine above which it agreed with a fresh answer ``needed`` times, what the
    tenant's bound needs at 95% (``min_observations``; none disagreed, or it would be gone).
    Never below ``floor``. ``needed`` None: no entry goes below the line.

    One agreement is no evidence for a 0.1% bound; letting it lower the entry served every
    look-alike the verifier let through down to that cosine, unmeasured by the line."""
    line = max(floor, tenant_line)
    if not agreed or not needed or len(agreed) < needed:
        return line
    return max(floor, min(line, sorted(agreed, reverse=True)[needed - 1]))


def add_agreement(agreed: list[float] | None, similarity: float) -> list[float]:
    """The entry's kept agreement cosines with one more (the highest ``ENTRY_AGREEMENTS_KEPT``)."""
    return sorted([*(agreed or []), float(similarity)], reverse=True)[:ENTRY_AGREEMENTS_KEPT]


def _text_of(response: dict) -> tuple[str, str]:
    try:
        msg = response["choices"][0]["message"]
    except (TypeError, KeyError, IndexError):
        return "", ""
    calls = msg.get("tool_calls") or []
    return (msg.get("content") or ""), json.dumps(
        [[c.get("function", {}).get("name"), c.get("function", {}).get("arguments")]
         for c in calls], sort_keys=True)


def _canonical(text: str) -> str:
    text = text.strip()
    if text[:1] in "{[":
        try:
            return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
        except ValueError:
            pass
    return " ".join(text.split()).casefold()


def answers_agree(cached: dict, fresh: dict, *, exact: bool, similarity: float = 0.9) -> bool:
    """Whether a fresh answer confirms the cached one: equal (JSON compared as data, text
    once whitespace and case are folded) for temperature-0 extraction (``exact``); else
    text whose character-level similarity ratio is at least ``similarity``. Tool calls
    must be equal either way."""
    (ca, ta), (cb, tb) = _text_of(cached), _text_of(fresh)
    if ta != tb:
        return False
    a, b = _canonical(ca), _canonical(cb)
    if a == b:
        return True
    if exact:
        return False
    return difflib.SequenceMatcher(None, a, b).ratio() >= similarity
