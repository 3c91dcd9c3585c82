"""vLLM ``/metrics`` (Prometheus text) -> live replica stats.

The stats go two places: a Redis hash ``<ns>:replica:<id>:stats`` with a TTL (the
gateway's bounded load reads ``num_requests_waiting``; a dead scraper's figures expire)
and a ``ReplicaMetric`` row per scrape (the console's time series).
"""
from __future__ import annotations

import re
from typing import Any, Iterable

Labels = tuple[tuple[str, str], ...]
Samples = dict[tuple[str, Labels], float]

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?\s*$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

# Live stat field -> (sample name, how to combine across label sets).
GAUGES = {
    "num_requests_running": "vllm:num_requests_running",
    "num_requests_waiting": "vllm:num_requests_waiting",
    "kv_cache_usage_perc": "vllm:kv_cache_usage_perc",
}
COUNTERS = {
    "prefix_cache_queries": "vllm:prefix_cache_queries",
    "prefix_cache_hits": "vllm:prefix_cache_hits",
    "spec_decode_num_draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "spec_decode_num_accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
    "prompt_tokens": "vllm:prompt_tokens",
    "generation_tokens": "vllm:generation_tokens",
}


def _unescape(v: str) -> str:
    return v.replace(r"\"", '"').replace(r"\n", "\n").replace("\\\\", "\\")


def parse_prometheus(text: str) -> Samples:
    """Every sample line as ``{(name, sorted label pairs): value}``; comments skipped."""
    out: Samples = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        name, raw_labels, raw_value = m.groups()
        try:
            value = float(raw_value)
        except ValueError:
            continue
        labels = tuple(sorted((k, _unescape(v)) for k, v in _LABEL.findall(raw_labels or "")))
        out[(name, labels)] = value
    return out


def _sum(samples: Samples, names: Iterable[str]) -> float:
    wanted = set(names)
    return sum(v for (n, _), v in samples.items() if n in wanted)


def live_stats(samples: Samples) -> dict[str, Any]:
    """Sum over engines/models (a data-parallel vLLM reports one series per engine).
    Counters are read with or without the ``_total`` suffix."""
    stats: dict[str, Any] = {f: _sum(samples, [n]) for f, n in GAUGES.items()}
    # KV usage is a fraction per engine: report the busiest, not a sum over engines.
    kv = [v for (n, _), v in samples.items() if n == GAUGES["kv_cache_usage_perc"]]
    stats["kv_cache_usage_perc"] = max(kv) if kv else 0.0
    for f, n in COUNTERS.items():
        stats[f] = _sum(samples, [n, f"{n}_total"])
    stats["ttft_seconds_sum"] = _sum(samples, ["vllm:time_to_first_token_seconds_sum"])
    stats["ttft_seconds_count"] = _sum(samples, ["vllm:time_to_first_token_seconds_count"])
    adapters: set[str] = set()
    for (n, labels), _ in samples.items():
        if n == "vllm:lora_requests_info":
            for k, v in labels:
                if k in ("running_lora_adapters", "waiting_lora_adapters") and v:
                    adapters.update(a for a in v.split(",") if a)
    stats["lora_adapters"] = ",".join(sorted(adapters))
    q = stats["prefix_cache_queries"]
    stats["prefix_cache_hit_rate"] = stats["prefix_cache_hits"] / q if q else 0.0
    c = stats["ttft_seconds_count"]
    stats["ttft_mean_seconds"] = stats["ttft_seconds_sum"] / c if c else 0.0
    return stats


def stats_key(keys, replica_id: int) -> str:
    return keys.replica_stats(replica_id)


def store_live(redis, keys, replica_id: int, stats: dict[str, Any], *, ttl_s: int = 30,
               at: float) -> None:
    """Write the stats hash (all fields strings) and its TTL in one round trip."""
    mapping = {k: (f"{v:.6g}" if isinstance(v, float) else str(v)) for k, v in stats.items()}
    mapping["scraped_at"] = f"{at:.3f}"
    pipe = redis.pipeline()
    pipe.hset(stats_key(keys, replica_id), mapping=mapping)
    pipe.expire(stats_key(keys, replica_id), ttl_s)
    pipe.execute()


def read_live(redis, keys, replica_id: int) -> dict[str, str]:
    raw = redis.hgetall(stats_key(keys, replica_id))
    return {(k.decode() if isinstance(k, bytes) else k):
            (v.decode() if isinstance(v, bytes) else v) for k, v in raw.items()}


def metric_row_values(stats: dict[str, Any]) -> dict[str, float]:
    """The ``ReplicaMetric`` columns from live stats."""
    cols = ("prefix_cache_queries", "prefix_cache_hits", "kv_cache_usage_perc",
            "num_requests_running", "num_requests_waiting", "ttft_seconds_sum",
            "ttft_seconds_count", "spec_decode_num_draft_tokens",
            "spec_decode_num_accepted_tokens")
    return {c: float(stats.get(c, 0.0)) for c in cols}
