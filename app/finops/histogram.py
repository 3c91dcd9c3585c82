"""Fixed-bucket TTFT histograms: rollups keep counts per bucket, so p50/p95 over any
period merge without reading the ledger. Pure."""
from __future__ import annotations

from typing import Sequence

# Upper bounds (ms) of each bucket; one last bucket holds everything above.
TTFT_BOUNDS: tuple[float, ...] = (
    2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 25, 30, 35, 40, 50, 60, 80, 100, 125, 150,
    200, 250, 300, 400, 500, 750, 1000, 1500, 2000, 3000, 5000, 10000, 30000)
N_BUCKETS = len(TTFT_BOUNDS) + 1


def bucket_of(ttft_ms: float) -> int:
    for i, bound in enumerate(TTFT_BOUNDS):
        if ttft_ms < bound:
            return i
    return len(TTFT_BOUNDS)


def merge(hists: Sequence[Sequence[int]]) -> list[int]:
    out = [0] * N_BUCKETS
    for h in hists:
        for i, c in enumerate(h or ()):
            if i < N_BUCKETS:
                out[i] += int(c or 0)
    return out


def percentile(hist: Sequence[int], q: float) -> float | None:
    """The q-quantile (0..1), interpolated linearly inside its bucket; None if empty.
    Exact to the bucket's width (2 ms below 22 ms)."""
    total = sum(hist)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for i, count in enumerate(hist):
        if count and seen + count >= rank:
            lo = 0.0 if i == 0 else float(TTFT_BOUNDS[i - 1])
            hi = float(TTFT_BOUNDS[i]) if i < len(TTFT_BOUNDS) else lo * 2
            return lo + (hi - lo) * max(rank - seen, 0) / count
        seen += count
    return float(TTFT_BOUNDS[-1])
