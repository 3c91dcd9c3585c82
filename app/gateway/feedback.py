"""Downstream validator feedback (pass/fail per request), the signal the flywheel learns from.

Events go to the Redis stream ``<ns>:feedback:stream`` (fields: ``e`` = JSON of
``app.contract.events.FeedbackEvent``). Readers use their own consumer groups: the ledger drain copies the
verdict onto the request's ledger row (``payload.feedback``); the cache and the router
read it for themselves.
"""
from __future__ import annotations

import orjson

from app.contract.events import STREAM_MAXLEN, feedback_event, owner_keys
from app.gateway.errors import GatewayError, bad_request

def parse_feedback(body: dict) -> tuple[str, bool, str]:
    """(request_id, passed, note) from ``{"request_id", "verdict": "pass"|"fail" | "pass":
    bool, "note"}``; raises a 400 naming the field."""
    rid = body.get("request_id")
    if not isinstance(rid, str) or not rid or len(rid) > 64:
        raise bad_request("'request_id' must be the x-sluice-request-id of a request.",
                          "request_id")
    if "verdict" in body:
        if body["verdict"] not in ("pass", "fail"):
            raise bad_request("'verdict' must be 'pass' or 'fail'.", "verdict")
        passed = body["verdict"] == "pass"
    elif isinstance(body.get("pass"), bool):
        passed = body["pass"]
    else:
        raise bad_request("Missing required parameter: 'verdict' ('pass' or 'fail').",
                          "verdict", "missing_required_parameter")
    note = body.get("note") or ""
    if not isinstance(note, str):
        raise bad_request("'note' must be a string.", "note", "invalid_type")
    return rid, passed, note


def _owner(values: list) -> int | None:
    found = next((v for v in values if v is not None), None)
    return int(found) if found is not None else None


async def record_feedback(redis, keys, tenant_id: int, request_id: str, passed: bool,
                          note: str = "") -> dict:
    """Check the request belongs to the tenant, then append the event. 404 otherwise."""
    pipe = redis.pipeline(transaction=False)
    for key in owner_keys(keys):
        pipe.hget(key, request_id)
    owner = _owner(await pipe.execute())
    if owner is None or owner != int(tenant_id):
        raise GatewayError(404, f"No request {request_id!r} for this key.",
                           param="request_id", code="request_not_found")
    ev = feedback_event(tenant_id, request_id, passed, note)
    await redis.xadd(keys.feedback_stream(), {"e": orjson.dumps(ev)}, maxlen=STREAM_MAXLEN,
                     approximate=True)
    return ev


def record_feedback_sync(redis, keys, tenant_id: int, request_id: str, passed: bool,
                         note: str = "") -> dict:
    """The same for synchronous callers (console, workers) with a ``redis.Redis``."""
    pipe = redis.pipeline(transaction=False)
    for key in owner_keys(keys):
        pipe.hget(key, request_id)
    owner = _owner(pipe.execute())
    if owner is None or owner != int(tenant_id):
        raise GatewayError(404, f"No request {request_id!r} for this tenant.",
                           param="request_id", code="request_not_found")
    ev = feedback_event(tenant_id, request_id, passed, note)
    redis.xadd(keys.feedback_stream(), {"e": orjson.dumps(ev)}, maxlen=STREAM_MAXLEN,
               approximate=True)
    return ev
