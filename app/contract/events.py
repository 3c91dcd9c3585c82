"""The events the gateway sends the control plane, and their streams.

- Ledger events: one per request, appended to ``Keys.ledger_stream()`` (field ``e``: the
  JSON of a ``LedgerEvent``) by the gateway's ledger writer, drained into
  ``ledger_entries`` by the worker (idempotent on ``request_id``).
- Feedback events: a validator's verdict on one request, appended to
  ``Keys.feedback_stream()`` (field ``e``: a ``FeedbackEvent``); the drain copies it onto
  the request's ledger row, the cache and the router read it for themselves.
- Request owners: ``Keys.request_owners(day)`` maps each request id booked that UTC day to
  its tenant, so feedback can only name a tenant's own requests.
"""
from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from typing import Any, NotRequired, TypedDict

from app.contract.keys import Keys

STREAM_MAXLEN = 1_000_000          # approximate cap of the feedback stream
REQUEST_TTL_S = 7 * 86400          # how long /v1/feedback can name a request
OWNER_DAYS = REQUEST_TTL_S // 86400 + 1
PROTOCOL = "sluice-gateway-1"      # the telemetry payload's protocol_version


class LedgerEvent(TypedDict):
    """What the drain writes as one ``ledger_entries`` row. Money is a decimal string
    (exact: fractions of a cent), tokens are counts, ``payload`` is the seed's 6.2
    telemetry record."""

    request_id: str
    at: str                      # ISO 8601, UTC: when the request was booked and priced
    tenant_id: int
    workflow: str
    workflow_name: str
    tier: str                    # "" when nothing was generated (cache hit, failure)
    model: str
    status: int
    cache: str                   # miss | exact | semantic
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cost_usd: str
    baseline_cost_usd: str
    escalated: bool
    ttft_ms: float | None
    latency_ms: float
    usage_source: str            # upstream | counted (app.gateway.usage)
    adapter: str                 # the LoRA adapter that answered ("" for the base model)
    kind: NotRequired[str]       # request (default) | shadow (app.gateway.shadow: an
    #                              adapter's off-path run, never on the tenant's budget)
    # What each stage saved against the frontier baseline (app.core.pricing.stage_savings),
    # decimal strings; the five add up to baseline_cost_usd - cost_usd (0 when absent).
    saved_cache_usd: NotRequired[str]
    saved_routing_usd: NotRequired[str]
    saved_minify_usd: NotRequired[str]
    saved_prefix_usd: NotRequired[str]
    saved_escalation_usd: NotRequired[str]   # <= 0: discarded low-margin attempts' cost
    # Tool traffic (app.gateway.tool_retrieval): definition tokens sent, kept out by
    # retrieval, and 1 when an unsent tool was called and the request went again
    tool_tokens: NotRequired[int]
    tool_tokens_saved: NotRequired[int]
    tool_retries: NotRequired[int]
    payload: dict[str, Any]


class FeedbackEvent(TypedDict):
    tenant_id: int
    request_id: str
    # "pass" is a keyword in Python: the key is spelt as sent
    note: str
    at: str


def feedback_event(tenant_id: int, request_id: str, passed: bool, note: str = "") -> dict:
    """A ``FeedbackEvent`` with its ``pass`` verdict."""
    return {"tenant_id": tenant_id, "request_id": request_id, "pass": bool(passed),
            "note": note[:2000], "at": datetime.now(timezone.utc).isoformat()}


def request_owner_key(keys: Keys, day: date | None = None) -> str:
    """Hash of request_id -> tenant_id for one UTC day (feedback checks ownership)."""
    return keys.request_owners(day or datetime.now(timezone.utc).date())


def owner_keys(keys: Keys) -> list[str]:
    """Every day's owner hash a request still within REQUEST_TTL_S may be in."""
    today = datetime.now(timezone.utc).date()
    return [request_owner_key(keys, today - timedelta(days=d)) for d in range(OWNER_DAYS)]
