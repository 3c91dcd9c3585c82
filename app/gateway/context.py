"""Everything one request carries through the pipeline."""
from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from app.contract.snapshot import Snapshot

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from app.contract.keys import Keys
    from app.contract.routers import PublishedRouters
    from app.gateway.stages.s00_cache import GatewayCache
    from app.gateway.telemetry import GatewayMetrics
    from app.gateway.upstream import Upstream
    from app.gateway.workflow_memory import SharedWorkflowMemory


class GatewayServices(Protocol):
    """What a stage may use of the gateway process: named services, nothing else.
    ``app.gateway.asgi.Gateway`` provides them; a unit test passes only what it needs."""

    config: Mapping[str, Any]
    keys: Keys
    redis: aioredis.Redis
    upstream: Upstream
    metrics: GatewayMetrics
    cache: GatewayCache
    routers: PublishedRouters
    tool_memory: SharedWorkflowMemory   # S02's tool retrieval memory (sync Redis client)

    async def track_replica(self, ctx: RequestContext, replica_id: Any) -> None:
        """Count ``ctx`` in flight on ``replica_id`` until it is booked (with the prompt
        tokens it left S03 to prefill there, ``ctx.kv_unmatched``, until its first token)."""

    def prefilled(self, ctx: RequestContext) -> None:
        """``ctx``'s first token came: its replica has no prefill left to do for it."""

    async def release_budget(self, ctx: RequestContext) -> None:
        """Settle the request's budget hold now at cost 0 (a cache hit)."""


@dataclass
class RequestContext:
    request_id: str
    snapshot: Snapshot
    tenant: dict
    key: dict
    body: dict
    client_headers: dict[str, str] = field(default_factory=dict)
    services: GatewayServices | None = None  # the gateway process (None: a bare unit test)
    started: float = field(default_factory=time.perf_counter)

    # request, parsed
    requested_model: str = ""
    requested_tier: dict | None = None      # None: "auto"
    stream: bool = False
    include_usage: bool = False
    workflow_signature: str = ""
    workflow_name: str = ""
    workflow: dict | None = None            # snapshot entry; None for a new workflow
    session_id: str | None = None
    budget_reserved: Any = None             # Decimal held at admission (None: not held)
    budget_period: str = ""

    # decisions
    state: str = ""
    trace: list[str] = field(default_factory=list)      # states visited
    fallbacks: list[str] = field(default_factory=list)  # fallback states taken
    stage_errors: list[str] = field(default_factory=list)
    embedding: Any = None                   # one embedding per request: cache and router share it
    cache: str = "miss"                     # miss | exact | semantic
    cache_key: Any = None                   # app.contract.cache.keys.CacheKey once S00 probed
    cached_response: dict | None = None
    collect_stream: bool = False            # a stage wants the streamed answer assembled
    collected: dict | None = None           # ... which the relay puts here
    router_score: float | None = None      # 1 - q of the cheapest tier (S01's router)
    router_features: Any = None             # S01's feature vector (a training trace)
    tier: dict | None = None
    replica: dict | None = None
    routing_key: str | None = None          # S03's rendezvous key (session or static prefix)
    adapter: str | None = None              # the LoRA adapter S04 asked for (app.gateway.adapters)
    explore_sampled: bool | None = None     # drawn for tier-1 exploration (app.gateway.shadow)
    inflight_replica: Any = None            # replica id counted in flight (released on book)
    inflight_pending: int = 0               # prompt tokens counted awaiting prefill there
    kv_unmatched: tuple | None = None       # S03 kv_events: (replica id, tokens it must prefill)
    failed_replicas: set = field(default_factory=set)
    escalated: bool = False
    margin: float | None = None
    upstream_body: dict | None = None       # what S04 sends (S02 may rewrite it)
    tools_body: dict | None = None          # the body with the tools retrieval chose (S02)
    key_map: Any = None                     # S02's KeyMap (minified -> original) for S05
    minify: Any = None                      # s02_minify.MinifyState when S02 minified
    # S04: (S02's (body, state), an adapter's trained form of it) once an attempt needed it
    form_swap: Any = None
    stream_hooks: list = field(default_factory=list)  # relay hooks: .chunk(dict), .done()
    attempts: list[dict] = field(default_factory=list)  # discarded attempts, still paid for

    # upstream results
    upstream_status: int = 0
    upstream_headers: dict[str, str] = field(default_factory=dict)
    upstream_response: Any = None           # open http1.Response while streaming
    first_chunk: bytes = b""
    response_json: dict | None = None       # non-streaming body
    response_bytes: bytes = b""
    last_error: Exception | None = None

    # outcome
    status: int = 200
    error: str = ""
    ttft_ms: float | None = None
    usage: dict = field(default_factory=dict)
    telemetry: dict = field(default_factory=dict)

    @property
    def policy(self) -> dict:
        return self.tenant["policy"]

    def record_attempt(self, reason: str) -> None:
        """Book the current attempt's usage as a discarded attempt (a schema retry, an
        escalation): the ledger pays for it on top of the answer served."""
        from app.core.pricing import tier_cost
        from app.gateway.telemetry import usage_tokens
        p, c, o = usage_tokens(self.usage)
        self.attempts.append({"tier": (self.tier or {}).get("name"), "reason": reason,
                              "replica": (self.replica or {}).get("name"),
                              "adapter": self.adapter,
                              "prompt_tokens": p, "cached_tokens": c, "completion_tokens": o,
                              "cost_usd": f"{tier_cost(self.tier or {}, None, p, c, o):f}"})
        self.usage = {}

    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.started) * 1000.0
