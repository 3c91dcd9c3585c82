"""Per-request telemetry (seed payload 6.2), Prometheus metrics and the ledger event."""
from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from app.contract.events import PROTOCOL, LedgerEvent
from app.core.pricing import STAGES, book_cost, stage_savings
from app.gateway.context import RequestContext

_LAT = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class GatewayMetrics:
    """Metrics on their own registry, so several gateways (tests) never collide."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("sluice_gateway_requests", "Requests served, by outcome",
                                ["tier", "cache", "status"], registry=r)
        self.rejected = Counter("sluice_gateway_rejected", "Requests refused before the "
                                "pipeline", ["status", "code"], registry=r)
        self.ttft = Histogram("sluice_gateway_ttft_seconds", "Time to first upstream byte",
                              ["tier"], buckets=_LAT, registry=r)
        self.latency = Histogram("sluice_gateway_request_seconds", "Whole request",
                                 ["tier"], buckets=_LAT, registry=r)
        self.tokens = Counter("sluice_gateway_tokens", "Tokens by kind (in, cached, out)",
                              ["tier", "kind"], registry=r)
        self.cost = Counter("sluice_gateway_cost_usd", "Attributed cost", ["tier"], registry=r)
        self.baseline = Counter("sluice_gateway_baseline_cost_usd",
                                "Frontier-equivalent cost of the same tokens", ["tier"],
                                registry=r)
        self.escalations = Counter("sluice_gateway_escalations", "Tier escalations",
                                   ["reason"], registry=r)
        self.fallbacks = Counter("sluice_gateway_fallbacks", "Pipeline fallback states taken",
                                 ["state"], registry=r)
        self.upstream_failures = Counter("sluice_gateway_upstream_failures",
                                         "Upstream failures before the first byte",
                                         ["tier", "kind"], registry=r)
        self.stream_errors = Counter("sluice_gateway_stream_errors",
                                     "Streams ended by an upstream failure after the first byte",
                                     ["tier"], registry=r)
        self.schema_errors = Counter("sluice_gateway_schema_errors", "S98 schema alerts",
                                     registry=r)
        self.in_flight = Gauge("sluice_gateway_in_flight", "Requests in the pipeline",
                               registry=r)
        self.snapshot_version = Gauge("sluice_gateway_snapshot_version",
                                      "Config snapshot version in service", registry=r)
        self.ledger_backlog = Gauge("sluice_gateway_ledger_backlog",
                                    "Ledger events waiting to reach Redis", registry=r)
        self.shadow_runs = Counter("sluice_gateway_shadow_runs", "Shadow runs of adapters "
                                   "(app.gateway.shadow), by outcome", ["outcome"], registry=r)
        self.explore_runs = Counter("sluice_gateway_explore_runs", "Tier-1 exploration runs "
                                    "for the router's labels (app.gateway.shadow), by outcome",
                                    ["outcome"], registry=r)
        self.cache_verify_runs = Counter("sluice_gateway_cache_verify_runs", "Sampled cache "
                                         "hits generated again off the path "
                                         "(app.gateway.cache_verify), by outcome",
                                         ["outcome"], registry=r)
        self.ledger_errors = Counter("sluice_gateway_ledger_write_errors",
                                     "Failed ledger stream writes (retried)", registry=r)

        self._children: dict[tuple, tuple] = {}

    def observe(self, tier: str, cache: str, status: int, latency_s: float,
                ttft_s: float | None, tokens: tuple[int, int, int], cost: Decimal,
                baseline: Decimal, escalated: bool | str) -> None:
        """``escalated``: False, or the escalation reason (True counts as upstream_failure)."""
        """Record one finished request (label children cached: this is per request)."""
        key = (tier, cache, status)
        ch = self._children.get(key)
        if ch is None:
            ch = self._children[key] = (
                self.requests.labels(tier, cache, str(status)), self.latency.labels(tier),
                self.ttft.labels(tier), self.tokens.labels(tier, "in"),
                self.tokens.labels(tier, "cached"), self.tokens.labels(tier, "out"),
                self.cost.labels(tier), self.baseline.labels(tier))
        requests, latency, ttft, t_in, t_cached, t_out, c_cost, c_base = ch
        requests.inc()
        latency.observe(latency_s)
        if ttft_s is not None:
            ttft.observe(ttft_s)
        prompt, cached, out = tokens
        t_in.inc(prompt)
        t_cached.inc(cached)
        t_out.inc(out)
        c_cost.inc(float(cost))
        c_base.inc(float(baseline))
        if escalated:
            reason = escalated if isinstance(escalated, str) else "upstream_failure"
            self.escalations.labels(reason).inc()

    def upstream_failure(self, tier: str, kind: str) -> None:
        self.upstream_failures.labels(tier, kind).inc()


def _count(value) -> int:
    """A token count as the upstream reported it, or 0 when it is not one (a negative, a
    string, a float that is not whole: a misbehaving upstream never breaks the booking)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0
    if isinstance(value, float) and not value.is_integer():
        return 0
    return max(int(value), 0)


def usage_tokens(usage: dict | None) -> tuple[int, int, int]:
    """(prompt, cached, completion) from an OpenAI usage object; cached never above prompt."""
    usage = usage if isinstance(usage, dict) else {}
    details = usage.get("prompt_tokens_details")
    details = details if isinstance(details, dict) else {}
    prompt = _count(usage.get("prompt_tokens"))
    return (prompt, min(_count(details.get("cached_tokens")), prompt),
            _count(usage.get("completion_tokens")))


def _escalation(ctx: RequestContext) -> bool | str:
    """The last escalation's reason, or False."""
    if not ctx.escalated:
        return False
    steps = ctx.telemetry.get("escalations") or [{}]
    return steps[-1].get("reason") or "upstream_failure"


def _tool_counts(ctx: RequestContext) -> dict[str, int]:
    """The ledger's tool columns (app.gateway.tool_retrieval), absent without tools."""
    info = ctx.telemetry.get("tools") or {}
    if "definition_tokens" not in info:
        return {}
    return {"tool_tokens": int(info["definition_tokens"]),
            "tool_tokens_saved": int(info.get("saved_tokens") or 0),
            "tool_retries": int(info.get("retries") or 0)}


def finish(ctx: RequestContext, metrics: GatewayMetrics | None) -> LedgerEvent:
    """Close the books on a request: telemetry record, metrics, and the ledger event."""
    latency_ms = ctx.elapsed_ms()
    prompt, cached, out = usage_tokens(ctx.usage)
    tier = ctx.tier or {}
    served = ctx.cache == "miss" and bool(tier)
    at = datetime.now(timezone.utc)  # priced at the price in force when booked
    # The frontier baseline is what it would have generated: the output with the client's
    # own keys when S02 minified them (so the ledger shows what minification saved).
    raw_out = (ctx.telemetry.get("minify") or {}).get("raw_schema_output_tokens_equivalent")
    cost, baseline = book_cost(ctx.snapshot.all_tiers, tier if served else None, at,
                               prompt, cached, out,
                               baseline_completion_tokens=int(raw_out) if raw_out else None)
    cost += sum((Decimal(a["cost_usd"]) for a in ctx.attempts), Decimal(0))
    saved = stage_savings(ctx.snapshot.all_tiers, tier if served else None, at, prompt, cached,
                          out, int(raw_out) if raw_out else None, ctx.attempts,
                          cache_hit=ctx.cache != "miss")
    tier_name = tier.get("name", "") if served else ""
    computed = max(prompt - cached, 0)
    record = {
        "protocol_version": PROTOCOL,
        "request_id": ctx.request_id,
        "tenant_department": ctx.tenant.get("department") or ctx.tenant.get("name"),
        "workflow": ctx.workflow_signature,
        "caching_and_routing_decision": {
            "cache_decision": ctx.cache,
            "semantic_cache_hit": ctx.cache == "semantic",
            "radix_prefix_cache_tokens_reused": cached,
            "radix_prefix_cache_tokens_computed": computed,
            "prefix_cache_hit_ratio": round(cached / prompt, 4) if prompt else 0.0,
            "router_complexity_score": ctx.router_score,
            "route_reason": ctx.telemetry.get("route_reason"),
            "assigned_compute_tier": tier_name,
            "replica": (ctx.replica or {}).get("name"),
            "adapter": ctx.adapter if served else None,
            "logprob_margin_confidence": ctx.margin,
            "cascade_fallback_triggered": ctx.escalated,
        },
        "token_and_latency_telemetry": {
            "time_to_first_token_ms": round(ctx.ttft_ms, 3) if ctx.ttft_ms is not None else None,
            "latency_ms": round(latency_ms, 3),
            "prompt_tokens": prompt, "cached_tokens": cached, "completion_tokens": out,
            "request_cost_usd": f"{cost:f}",
            "baseline_frontier_equivalent_cost_usd": f"{baseline:f}",
            "savings_by_stage_usd": {s: f"{v:f}" for s, v in saved.items()},
        },
        "attempts": ctx.attempts,
        # a router training trace (app.cascade.traces): S01's input and the tier served
        "router_features": ([round(float(v), 5) for v in ctx.router_features]
                            if ctx.router_features is not None else None),
        "tier_rank": tier.get("rank") if served else None,
        "escalated_from": ctx.telemetry.get("escalated_from"),
        "pipeline": {"states": ctx.trace, "fallbacks": ctx.fallbacks,
                     "stage_errors": ctx.stage_errors, **{k: v for k, v in ctx.telemetry.items()
                                                          if k not in ("route_reason", "booked",
                                                                       "escalated_from",
                                                                       "usage_source")}},
        "status": ctx.status, "error": ctx.error,
        "usage_source": ctx.telemetry.get("usage_source", "upstream"),
    }
    if metrics is not None:
        metrics.observe(tier_name or "none", ctx.cache, ctx.status, latency_ms / 1000,
                        ctx.ttft_ms / 1000 if ctx.ttft_ms is not None else None,
                        (prompt, cached, out), cost, baseline, _escalation(ctx))
    ctx.telemetry["cost_usd"] = cost
    return {
        "request_id": ctx.request_id, "at": at.isoformat(),
        "tenant_id": ctx.tenant["id"], "workflow": ctx.workflow_signature,
        "workflow_name": ctx.workflow_name, "tier": tier_name,
        "model": ctx.snapshot.served_model(tier) if served else "",
        "status": ctx.status, "cache": ctx.cache, "prompt_tokens": prompt,
        "cached_tokens": cached, "completion_tokens": out, "cost_usd": f"{cost:f}",
        "baseline_cost_usd": f"{baseline:f}", "escalated": ctx.escalated,
        "ttft_ms": record["token_and_latency_telemetry"]["time_to_first_token_ms"],
        "latency_ms": round(latency_ms, 3), "usage_source": record["usage_source"],
        "adapter": (ctx.adapter or "") if served else "", "kind": "request",
        **{f"saved_{s}_usd": f"{saved[s]:f}" for s in STAGES},
        **_tool_counts(ctx),
        "payload": record,
    }
