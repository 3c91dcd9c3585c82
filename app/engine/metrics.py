"""Counters the engine keeps, rendered as Prometheus text under vLLM's metric names."""
from __future__ import annotations

import threading
import time

# vLLM's buckets for vllm:time_to_first_token_seconds.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


class _Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for i, le in enumerate(self.buckets):
            if value <= le:
                self.counts[i] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out = [f'{name}_bucket{{{labels},le="{le}"}} {float(c)}'
               for le, c in zip(self.buckets, self.counts)]
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {float(self.count)}')
        out.append(f"{name}_count{{{labels}}} {float(self.count)}")
        out.append(f"{name}_sum{{{labels}}} {self.sum}")
        return out


class EngineMetrics:
    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self._lock = threading.Lock()
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success: dict[str, int] = {}
        self.ttft = _Histogram(TTFT_BUCKETS)
        self.e2e = _Histogram(E2E_BUCKETS)

    def prefix_lookup(self, queried: int, hit: int) -> None:
        with self._lock:
            self.prefix_queries += queried
            self.prefix_hits += hit

    def first_token(self, seconds: float) -> None:
        with self._lock:
            self.ttft.observe(seconds)

    def finished(self, prompt: int, generated: int, finish: str, seconds: float) -> None:
        with self._lock:
            self.prompt_tokens += prompt
            self.generation_tokens += generated
            self.success[finish] = self.success.get(finish, 0) + 1
            self.e2e.observe(seconds)

    def render(self, *, running: int, waiting: int, kv_usage: float, max_loras: int,
               running_adapters: list[str], waiting_adapters: list[str]) -> str:
        lab = f'engine="0",model_name="{self.model_name}"'
        out: list[str] = []

        def metric(name: str, kind: str, help_: str, samples: list[str]) -> None:
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {kind}")
            out.extend(samples)

        with self._lock:
            metric("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
                   [f"vllm:num_requests_running{{{lab}}} {float(running)}"])
            metric("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
                   [f"vllm:num_requests_waiting{{{lab}}} {float(waiting)}"])
            metric("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
                   [f"vllm:kv_cache_usage_perc{{{lab}}} {kv_usage}"])
            metric("vllm:prefix_cache_queries", "counter",
                   "Prefix cache queries, in terms of number of queried tokens.",
                   [f"vllm:prefix_cache_queries_total{{{lab}}} {float(self.prefix_queries)}"])
            metric("vllm:prefix_cache_hits", "counter",
                   "Prefix cache hits, in terms of number of cached tokens.",
                   [f"vllm:prefix_cache_hits_total{{{lab}}} {float(self.prefix_hits)}"])
            metric("vllm:prompt_tokens", "counter", "Number of prefill tokens processed.",
                   [f"vllm:prompt_tokens_total{{{lab}}} {float(self.prompt_tokens)}"])
            metric("vllm:generation_tokens", "counter", "Number of generation tokens processed.",
                   [f"vllm:generation_tokens_total{{{lab}}} {float(self.generation_tokens)}"])
            metric("vllm:request_success", "counter", "Count of successfully processed requests.",
                   [f'vllm:request_success_total{{{lab},finished_reason="{r}"}} {float(n)}'
                    for r, n in sorted(self.success.items())])
            # No draft model on CPU: the counters exist (so dashboards work) and stay 0.
            metric("vllm:spec_decode_num_draft_tokens", "counter", "Number of draft tokens.",
                   [f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} 0.0"])
            metric("vllm:spec_decode_num_accepted_tokens", "counter", "Number of accepted tokens.",
                   [f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} 0.0"])
            metric("vllm:time_to_first_token_seconds", "histogram",
                   "Histogram of time to first token in seconds.",
                   self.ttft.lines("vllm:time_to_first_token_seconds", lab))
            metric("vllm:e2e_request_latency_seconds", "histogram",
                   "Histogram of e2e request latency in seconds.",
                   self.e2e.lines("vllm:e2e_request_latency_seconds", lab))
        metric("vllm:lora_requests_info", "gauge", "Running stats on lora requests.",
               [f'vllm:lora_requests_info{{max_lora="{max_loras}",'
                f'running_lora_adapters="{",".join(running_adapters)}",'
                f'waiting_lora_adapters="{",".join(waiting_adapters)}"}} {time.time()}'])
        return "\n".join(out) + "\n"
