"""The admin API's OpenAPI 3.0 description, served at ``GET /api/v1/openapi.json``.

Paths and methods come from the app's own URL map (every route of every area's
``api_bp``), so the description cannot fall behind a new route; request bodies and query
parameters come from ``BODIES`` / ``QUERIES`` below, written from the services' own field
rules (policy fields straight from ``app.contract.policy.FIELDS``). An operation with a
body that is not described gets a free-form object: still fuzzable, never silently
missing. ``tests/security/test_api_fuzz.py`` runs schemathesis over it: every
operation, random and malformed inputs, never a 500.
"""
from __future__ import annotations

import re
from typing import Any

from flask import Blueprint, current_app, jsonify

from app.contract import policy

api_bp = Blueprint("openapi_api", __name__)

_S, _I, _N, _B = {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}
_MONEY = {"oneOf": [{"type": "string"}, {"type": "number"}]}
_DATE = {"type": "string", "format": "date-time"}


def _obj(props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        out["required"] = list(required)
    return out


def _policy_schema() -> dict[str, Any]:
    props: dict[str, Any] = {}
    for name, f in policy.FIELDS.items():
        if f.kind is bool:
            props[name] = _B
        elif f.kind is int:
            props[name] = {"type": "integer", "minimum": f.lo, "maximum": f.hi}
        elif f.kind is float:
            props[name] = {"type": "number", "minimum": f.lo, "maximum": f.hi}
        elif f.kind is str:
            props[name] = {"type": "string", "enum": list(f.choices)} if f.choices else _S
        else:   # tier names: a list or a comma-separated string
            props[name] = {"oneOf": [{"type": "array", "items": _S}, _S]}
    return _obj(props)


_TENANT = _obj({"name": _S, "department": _S, "status": {"type": "string",
                                                         "enum": ["active", "suspended"]}})
_TIER = _obj({"name": _S, "rank": _I, "model": _S, "price_input_per_m": _MONEY,
              "price_cached_input_per_m": _MONEY, "price_output_per_m": _MONEY,
              "upstream_kind": {"type": "string", "enum": ["pool", "external"]},
              "pool_id": {"type": "integer", "nullable": True}, "endpoint_url": _S,
              "api_key_env": _S, "timeout_s": _N, "enabled": _B})
_POOL = _obj({"name": _S, "node": _S, "engine": {"type": "string",
                                                 "enum": ["vllm", "reference"]},
              "model": _S, "served_model_name": _S, "options": {"type": "object"},
              "desired_replicas": _I, "base_port": _I, "gpus_per_replica": _I,
              "gpu_type": _S})
_USER = _obj({"email": _S, "role": {"type": "string", "enum": [
    "admin", "ops", "finops", "approver", "viewer"]}, "tenant_id": {"type": "integer",
                                                                   "nullable": True},
              "active": _B, "password": _S})
_COMMENT = _obj({"comment": _S})

# (method, rule without the /api/v1 prefix) -> request body schema
BODIES: dict[tuple[str, str], dict[str, Any]] = {
    ("POST", "/tenants"): _TENANT,
    ("PATCH", "/tenants/<int:tenant_id>"): _TENANT,
    ("POST", "/tenants/<int:tenant_id>/keys"): _obj({"name": _S, "expires_at": {
        "type": "string", "nullable": True}}),
    ("PATCH", "/policies/global"): _policy_schema(),
    ("PUT", "/policies/global"): _policy_schema(),
    ("PATCH", "/tenants/<int:tenant_id>/policy"): _policy_schema(),
    ("PUT", "/tenants/<int:tenant_id>/policy"): _policy_schema(),
    ("POST", "/tiers"): _TIER, ("PATCH", "/tiers/<int:tier_id>"): _TIER,
    ("POST", "/pools"): _POOL, ("PATCH", "/pools/<int:pool_id>"): _POOL,
    ("POST", "/pools/<int:pool_id>/actions"): _obj({"action": {
        "type": "string", "enum": ["start", "drain", "stop", "restart"]}}),
    ("POST", "/pools/replicas/<int:replica_id>/actions"): _obj({"action": {
        "type": "string", "enum": ["start", "drain", "stop", "restart"]}}),
    ("POST", "/pools/<int:pool_id>/lora"): _obj({"action": {
        "type": "string", "enum": ["load", "unload"]}, "lora_name": _S, "lora_path": _S}),
    ("POST", "/users"): _USER, ("PATCH", "/users/<int:user_id>"): _USER,
    ("POST", "/tokens"): _obj({"name": _S}),
    ("POST", "/auth/locks/lift"): _obj({"email": _S, "address": _S}),
    ("PATCH", "/workflows/<int:workflow_id>"): _obj({"name": _S, "category": _S}),
    ("POST", "/finops/budgets/<int:tenant_id>"): _obj({
        "monthly_limit_usd": _MONEY, "action": {"type": "string",
                                                "enum": ["alert", "hard_stop"]},
        "webhook_url": _S}),
    ("PUT", "/finops/budgets/<int:tenant_id>"): _obj({
        "monthly_limit_usd": _MONEY, "action": {"type": "string",
                                                "enum": ["alert", "hard_stop"]},
        "webhook_url": _S}),
    ("POST", "/finops/adjustments"): _obj({"tenant_id": _I, "amount": _MONEY,
                                           "reason": _S}),
    ("POST", "/finops/adjustments/requests/<int:request_id>/<any(approve, reject):decision>"):
        _COMMENT,
    ("POST", "/finops/gpu-rates"): _obj({"gpu_type": _S, "hourly_usd": _MONEY,
                                         "effective_from": _DATE}),
    ("POST", "/finops/tiers/<int:tier_id>/prices"): _obj({
        "price_input_per_m": _MONEY, "price_cached_input_per_m": _MONEY,
        "price_output_per_m": _MONEY, "effective_from": _DATE}),
    ("POST", "/finops/rollups/rebuild"): _obj({"period": _S}),
    # ids: dead-letter stream ids ("<ms>-<seq>"); none: the oldest ``limit`` (1-500)
    ("POST", "/ledger/dead-letters/replay"): _obj({"ids": {"type": "array", "items": _S},
                                                   "limit": _I}),
    ("POST", "/cache/invalidate"): _obj({"tenant_id": _I, "workflow": _S, "all": _B}),
    ("POST", "/router/models/<int:model_id>/taus"): _obj({"quality_target": _N}),
    # issue 24: fit S04's γ for a tier (id or name) to a target recall/precision in (0, 1]
    # on the given traces ({margin, correct}) or the ledger's; save stores it on the tier
    ("POST", "/router/gamma"): _obj({"tier": _S, "kind": {"type": "string",
                                                          "enum": ["recall", "precision"]},
                                     "target": _N, "days": _N, "model": _S, "save": _B,
                                     "traces": {"type": "array", "items": _obj({
                                         "margin": _N, "correct": _B})}}),
    ("POST", "/adapters"): _obj({"tenant_id": _I, "workflow": _S,
                                 "hyperparams": {"type": "object"}}),
    ("POST", "/adapters/<int:adapter_id>/<event>"): _COMMENT,
}
_PERIOD = [("period", _S), ("start", _S), ("end", _S), ("tenant", _S)]
QUERIES: dict[str, list[tuple[str, dict]]] = {
    "/finops/dashboard": _PERIOD, "/finops/cohorts": _PERIOD, "/finops/showback": _PERIOD,
    "/finops/export/<report>.csv": _PERIOD,
    # issue 24: savings per stage; the twelve months ending with the period's month
    "/finops/savings": _PERIOD, "/finops/months": _PERIOD,
    "/audit": [("action", _S), ("limit", _I), ("offset", _I)],
    "/adapters": [("state", _S), ("tenant", _S)],
    "/ledger/dead-letters": [("limit", _I)],
}
_CONVERTER = re.compile(r"<(?:(\w+)(?:\(([^)]*)\))?:)?(\w+)>")


def _path(rule: str) -> tuple[str, list[dict[str, Any]]]:
    params = []

    def sub(m: re.Match) -> str:
        conv, args, name = m.group(1) or "string", m.group(2), m.group(3)
        schema: dict[str, Any] = {"type": "integer"} if conv == "int" else {"type": "string"}
        if conv == "any" and args:
            schema["enum"] = [a.strip() for a in args.split(",")]
        params.append({"name": name, "in": "path", "required": True, "schema": schema})
        return "{" + name + "}"
    return _CONVERTER.sub(sub, rule), params


def build(app) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for rule in sorted(app.url_map.iter_rules(), key=lambda r: r.rule):
        if not rule.rule.startswith("/api/v1/") or rule.endpoint.startswith("openapi_api."):
            continue
        short = rule.rule.removeprefix("/api/v1")
        path, params = _path(short)
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            op: dict[str, Any] = {
                "operationId": f"{rule.endpoint}.{method.lower()}",
                "parameters": params + [{"name": n, "in": "query", "required": False,
                                         "schema": s} for n, s in QUERIES.get(short, [])],
                "responses": {"default": {"description": "JSON; errors are "
                                          "{error: {code, message, fields}}"}},
                "security": [{"bearer": []}]}
            if method in ("POST", "PUT", "PATCH"):
                op["requestBody"] = {"required": True, "content": {"application/json": {
                    "schema": BODIES.get((method, short), {"type": "object"})}}}
            paths.setdefault(path, {})[method.lower()] = op
    return {"openapi": "3.0.3",
            "info": {"title": "Sluice admin API", "version": "1",
                     "description": "Bearer admin tokens (console: API tokens); each acts "
                                    "as its user, with that user's role and tenant scope."},
            "servers": [{"url": "/api/v1"}],
            "components": {"securitySchemes": {"bearer": {"type": "http",
                                                          "scheme": "bearer"}}},
            "paths": paths}


@api_bp.get("/openapi.json")
def openapi_json():
    """The description itself is public (it holds no data): what a client generator or a
    fuzzer reads."""
    return jsonify(build(current_app))
