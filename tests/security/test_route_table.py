"""The role × route table (issue 20): every console and admin-API route, walked by every
role, each as a global user, as a user scoped to the tenant the route targets ("own") and
as a user scoped to another tenant ("other"), and by a signed-out visitor.

``RULES`` says who may use each route. A route of ``app.url_map`` without a rule (or a
rule whose route is gone, or a method nobody walks) fails ``test_every_route_has_a_rule``:
a new route cannot ship unjudged.

Denied callers send a change that would succeed if they were allowed; they must get 403
or 404 (signed out: the console sends them to /login, the API answers 401) and leave the
database and Redis exactly as they were. Allowed callers send an empty or invalid body
(a 400/422, or the console's flash-and-redirect, shows authorization was passed): no
401/403/404, no 5xx, and no signed-in user sent back to /login. Every allowed side is
walked: the invalid bodies stop pool actions, drills, training and rollup rebuilds before
any work, and the allowed calls that do change something (revoke a key or token, delete
the budget, approve an adjustment, move an adapter) act on an object made for that call.
Routes that filter a listing instead of refusing name a ``hidden`` marker that the users
of ``hidden_from`` must not see (and that someone allowed does see).

One world (two tenants, users, sessions and tokens) serves the module: requests run with
no app context pushed, so each gets its own, as in production (a refused request's
session is not shared with the next one).
"""
from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass, field, replace
from decimal import Decimal

import pytest
import sqlalchemy as sa

from tests.console.web import csrf_from, login

ROLES = ("admin", "ops", "finops", "approver", "viewer")
SCOPES = ("global", "own", "other")
OWN_NAME = "acme-route-walk"            # the targeted tenant; its name is the hidden marker
OTHER_NAME = "bravo-route-walk"
NODE = "routewalknode"                  # shared infrastructure: no tenant user sees it
TENANT_USERS = ("own", "other")
WF_NAME = "acme-orders-walk"
ADJ_REASON = "acme-credit-walk"
DRILL_KEY = "sk-sluice-not-a-real-key"


# -- rules ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    """Who may: ``roles`` in ``scopes`` (and signed-out visitors when ``anon``)."""
    name: str
    roles: frozenset
    scopes: frozenset
    anon: bool = False

    def allows(self, role: str | None, scope: str | None) -> bool:
        if role is None:
            return self.anon
        return role in self.roles and scope in self.scopes


def _rule(name, roles=ROLES, scopes=SCOPES, anon=False) -> Rule:
    return Rule(name, frozenset(roles), frozenset(scopes), anon)


PUBLIC = _rule("public", anon=True)
SIGNED_IN = _rule("any signed-in user")
SEES = _rule("users who see the tenant (global or its own)", scopes=("global", "own"))
GLOBAL = _rule("global users", scopes=("global",))
OPS_ON_TENANT = _rule("admin/ops of the tenant (global or own)", ("admin", "ops"),
                      ("global", "own"))           # tenant/key/policy/workflow.manage,
#                                                   cache.invalidate, adapter.train
OPS_ANY_SCOPE = _rule("admin/ops, any scope (acts on its own tenant)", ("admin", "ops"))
INFRA = _rule("global admin/ops", ("admin", "ops"), ("global",))  # catalog, pools, drills,
#                                                                  global policy, τ
ADMIN = _rule("global admin", ("admin",), ("global",))            # users, audit, locks
BUDGET = _rule("admin/finops of the tenant", ("admin", "finops"), ("global", "own"))
CENTRAL_FINOPS = _rule("global admin/finops", ("admin", "finops"), ("global",))
APPROVE = _rule("admin/approver of the tenant", ("admin", "approver"), ("global", "own"))
ROLLBACK = _rule("admin/ops/approver of the tenant", ("admin", "ops", "approver"),
                 ("global", "own"))


@dataclass(frozen=True)
class Walk:
    """One method of one route: the URL and bodies use ``{name}`` placeholders filled from
    the world's ids (a body value that is exactly ``"{name}"`` becomes the int)."""
    method: str
    url: str
    rule: Rule
    deny: dict | None = None        # what a denied caller sends: a change that would work
    allow: dict | None = None       # what an allowed caller sends: empty or invalid
    fresh: str | None = None        # a new object per allowed call (see World.fresh)
    hidden: str | None = None       # a marker that users of ``hidden_from`` must not see
    hidden_from: tuple = ("other",)
    own_session: bool = False       # allowed calls use a throwaway user (sign-out)


def G(url, rule, **kw) -> Walk:
    return Walk("GET", url, rule, **kw)


def P(url, rule, deny=None, allow=None, **kw) -> Walk:
    return Walk("POST", url, rule, deny or {}, allow or {}, **kw)


def M(method, url, rule, deny=None, allow=None, **kw) -> Walk:
    return Walk(method, url, rule, deny or {}, allow or {}, **kw)


def _act(event: str, adapter: str, rule: Rule, api: bool = False) -> Walk:
    base = "/api/v1/adapters" if api else "/adapters"
    return P(f"{base}/{{{adapter}}}/{event}", rule, deny={"comment": "walk"},
             allow={"comment": "walk"}, fresh=adapter)


TIER_FORM = {"name": "tier-walk", "rank": "1", "model": "intruder-model",
             "price_input_per_m": "1", "price_cached_input_per_m": "0.25",
             "price_output_per_m": "3", "upstream_kind": "external",
             "endpoint_url": "http://127.0.0.1:9/v1", "timeout_s": "60", "enabled": "on"}
POOL_FORM = {"name": "pool-intruder", "node": "local", "engine": "reference", "model": "m",
             "options": "{}", "desired_replicas": "1", "base_port": "8600",
             "gpus_per_replica": "1", "capacity_weight": "1"}
USER_NEW = {"email": "intruder@example.com", "role": "admin", "password": "Long-enough-9!"}
DRILL = {"key": DRILL_KEY, "url": "http://127.0.0.1:9", "pool_id": "{pool}"}

RULES: dict[str, list[Walk]] = {
    # -- console ---------------------------------------------------------------------------
    "static": [G("/static/favicon.svg", PUBLIC)],
    "console.favicon": [G("/favicon.ico", PUBLIC)],
    "console.home": [G("/", SIGNED_IN, hidden=OWN_NAME)],
    "console.refresh_figures": [P("/overview/refresh", SIGNED_IN)],
    "auth.login": [G("/login", PUBLIC), P("/login", PUBLIC)],
    "auth.logout": [P("/logout", SIGNED_IN, own_session=True)],
    "auth.users": [G("/users", ADMIN)],
    "auth.user_new": [G("/users/new", ADMIN),
                      P("/users/new", ADMIN, USER_NEW, {"email": "not-an-email"})],
    "auth.user_edit": [G("/users/{victim}/edit", ADMIN),
                       P("/users/{victim}/edit", ADMIN,
                         {"email": "victim@example.com", "role": "admin", "active": "on"},
                         {"email": "not-an-email", "role": "viewer"})],
    "auth.tokens": [G("/tokens", SIGNED_IN), P("/tokens", SIGNED_IN, allow={"name": "walk"})],
    # someone else's token: only who manages users; one's own: everyone
    "auth.token_revoke": [P("/tokens/{victim_token}/revoke", ADMIN, fresh="victim_token"),
                          P("/tokens/{my_token}/revoke", SIGNED_IN, fresh="my_token")],
    "tenants.tenants": [G("/tenants", SIGNED_IN, hidden=OWN_NAME)],
    "tenants.tenant_new": [G("/tenants/new", INFRA),
                           P("/tenants/new", INFRA, {"name": "intruder", "department": "x",
                                                     "status": "active"}, {"name": ""})],
    "tenants.tenant_edit": [G("/tenants/{own}/edit", OPS_ON_TENANT),
                            P("/tenants/{own}/edit", OPS_ON_TENANT,
                              {"name": "renamed-by-intruder", "department": "",
                               "status": "active"}, {"name": ""})],
    "tenants.tenant_keys": [G("/tenants/{own}/keys", SEES),
                            P("/tenants/{own}/keys", OPS_ON_TENANT, {"name": "intruder"},
                              {"name": ""})],
    "tenants.key_revoke": [P("/keys/{key}/revoke", OPS_ON_TENANT, fresh="key")],
    "catalog.tiers": [G("/catalog/tiers", SIGNED_IN)],
    "catalog.tier_new": [G("/catalog/tiers/new", INFRA),
                         P("/catalog/tiers/new", INFRA, {**TIER_FORM, "name": "tier-new",
                                                         "rank": "9"}, {"name": ""})],
    "catalog.tier_edit": [G("/catalog/tiers/{tier}/edit", INFRA),
                          P("/catalog/tiers/{tier}/edit", INFRA, TIER_FORM, {"rank": "x"})],
    "catalog.pools": [G("/catalog/pools", SIGNED_IN, hidden=NODE, hidden_from=TENANT_USERS)],
    "catalog.pool_new": [G("/catalog/pools/new", INFRA),
                         P("/catalog/pools/new", INFRA, POOL_FORM, {"name": ""})],
    "catalog.pool_edit": [G("/catalog/pools/{pool}/edit", INFRA),
                          P("/catalog/pools/{pool}/edit", INFRA,
                            {**POOL_FORM, "name": "pool-walk"}, {"name": ""})],
    "policies.policy_global": [G("/policies", SIGNED_IN),
                               P("/policies", INFRA, {"margin_gamma": "0.5"},
                                 {"margin_gamma": "bogus"})],
    "policies.policy_tenant": [G("/tenants/{own}/policy", SEES),
                               P("/tenants/{own}/policy", OPS_ON_TENANT,
                                 {"max_tokens_cap": "100"}, {"margin_gamma": "bogus"})],
    "workflows.workflows_list": [G("/workflows", SIGNED_IN, hidden=WF_NAME)],
    "workflows.workflow_edit": [G("/workflows/{wf}/edit", OPS_ON_TENANT),
                                P("/workflows/{wf}/edit", OPS_ON_TENANT,
                                  {"name": "renamed", "category": "code_sql"},
                                  {"category": "bogus"})],
    "audit.audit": [G("/audit", ADMIN)],
    "pools.index": [G("/pools", GLOBAL)],
    "pools.plotly_js": [G("/pools/plotly.js", SIGNED_IN)],
    "pools.pool_action": [P("/pools/{pool}/action", INFRA, {"action": "stop"},
                            {"action": "bogus"})],
    "pools.replica_action": [P("/pools/replicas/{replica}/action", INFRA, {"action": "stop"},
                               {"action": "bogus"})],
    "pools.pool_lora": [P("/pools/{pool}/lora", INFRA, {"action": "unload", "lora_name": "x"},
                          {"action": "load", "lora_name": ""})],
    "drills.index": [G("/drills", INFRA)],
    "drills.replica_loss": [P("/drills/replica-loss", INFRA, DRILL, {"key": ""})],
    "drills.domain_shift": [P("/drills/domain-shift", INFRA, DRILL, {"key": ""})],
    "drills.cache_poisoning": [P("/drills/cache-poisoning", INFRA, {}, {"threshold": "abc"})],
    "finops.plotly_js": [G("/finops/plotly.js", PUBLIC)],
    "finops.dashboard": [G("/finops?tenant={own}", SEES)],
    "finops.cohorts": [G("/finops/cohorts?tenant={own}", SEES)],
    "finops.showback": [G("/finops/showback?tenant={own}", SEES)],
    "finops.savings_page": [G("/finops/savings?tenant={own}", SEES)],
    "finops.export": [G("/finops/export/ledger.csv?tenant={own}", SEES)],
    "finops.budgets": [G("/finops/budgets", SIGNED_IN, hidden=OWN_NAME),
                       P("/finops/budgets", BUDGET,
                         {"tenant_id": "{own}", "monthly_limit_usd": "1",
                          "action": "hard_stop"},
                         {"tenant_id": "{own}", "monthly_limit_usd": "-1", "action": "alert"})],
    "finops.budget_delete": [P("/finops/budgets/{own}/delete", CENTRAL_FINOPS,
                               fresh="budget")],
    "finops.price_book": [G("/finops/prices", SIGNED_IN),
                          P("/finops/prices", CENTRAL_FINOPS,
                            {"kind": "gpu", "gpu_type": "H100", "hourly_usd": "1"},
                            {"kind": "gpu", "gpu_type": "", "hourly_usd": "x"})],
    "finops.adjustment": [P("/finops/adjustments", CENTRAL_FINOPS,
                            {"tenant_id": "{own}", "amount": "-5", "reason": "intruder"},
                            {"tenant_id": "{own}", "amount": "0", "reason": ""})],
    "finops.adjustment_decision": [P("/finops/adjustments/requests/{adj}/approve",
                                     CENTRAL_FINOPS, {"comment": "ok"}, {"comment": "walk"},
                                     fresh="adj")],
    "finops.rollups_rebuild": [P("/finops/rollups/rebuild", CENTRAL_FINOPS, {"period": ""},
                                 {"period": "bogus"})],
    # dead letters hold every tenant's events: central FinOps and admins only
    "ledger.dead_letters": [G("/ledger/dead-letters", CENTRAL_FINOPS)],
    "ledger.dead_letters_replay": [P("/ledger/dead-letters/replay", CENTRAL_FINOPS, {},
                                     {"id": "bogus"})],
    "cascade.plotly_js": [G("/router/plotly.js", PUBLIC)],
    "cascade.index": [G("/router/", SIGNED_IN, hidden="tenant:{own}")],
    "cascade.scope_detail": [G("/router/scope/tenant:{own}", SEES)],
    # τ is calibrated centrally: a tenant's own ops may not set it
    "cascade.set_taus": [P("/router/models/{model}/taus", INFRA, {"quality_target": "99"},
                           {"quality_target": "abc"})],
    "cascade.activate": [P("/router/models/{model}/activate", OPS_ON_TENANT)],
    # γ is a tier setting (shared infrastructure): global admin/ops
    "cascade.gamma_page": [G("/router/gamma", INFRA),
                           P("/router/gamma", INFRA, {"tier": "{tier}", "clear": "1"},
                             {"tier": "{tier}", "kind": "bogus"})],
    "replica_routing.plotly_js": [G("/routing/plotly.js", PUBLIC)],
    "replica_routing.index": [G("/routing/", SIGNED_IN)],
    "replica_routing.simulate": [P("/routing/simulate", INFRA,
                                   {"replicas": "2", "kv_tokens": "1000", "requests": "10"},
                                   {"requests": "abc"})],
    "cache.index": [G("/cache/", OPS_ANY_SCOPE)],
    "cache.invalidate": [P("/cache/invalidate", OPS_ON_TENANT,
                           {"scope": "tenant", "tenant_id": "{own}"}, {"scope": "bogus"})],
    "adapters.plotly_js": [G("/adapters/plotly.js", SIGNED_IN)],
    "adapters.index": [G("/adapters", SIGNED_IN, hidden=WF_NAME)],
    "adapters.detail": [G("/adapters/{ad_awaiting}", SEES)],
    "adapters.act": [_act("approve", "ad_awaiting", APPROVE),
                     _act("reject", "ad_awaiting", APPROVE),
                     _act("advance", "ad_canary", APPROVE),
                     _act("promote", "ad_canary", APPROVE),
                     _act("rollback", "ad_canary", ROLLBACK),
                     _act("shadow", "ad_candidate", OPS_ON_TENANT),
                     _act("submit", "ad_candidate", OPS_ON_TENANT),
                     _act("retire", "ad_candidate", OPS_ON_TENANT),
                     _act("cancel", "ad_training", OPS_ON_TENANT)],
    "adapters.train": [P("/adapters/train", OPS_ON_TENANT,
                         {"tenant_id": "{own}", "workflow": WF_NAME},
                         {"tenant_id": "{own}", "workflow": "wf-none"})],
    # -- admin API ---------------------------------------------------------------------------
    "openapi_api.openapi_json": [G("/api/v1/openapi.json", PUBLIC)],
    "auth_api.api_me": [G("/api/v1/me", SIGNED_IN)],
    "auth_api.api_lift_lock": [P("/api/v1/auth/locks/lift", ADMIN,
                                 {"email": "victim@example.com"}, {"email": ""})],
    "auth_api.api_users_list": [G("/api/v1/users", ADMIN)],
    "auth_api.api_user_create": [P("/api/v1/users", ADMIN, USER_NEW, {"email": ""})],
    "auth_api.api_user_get": [G("/api/v1/users/{victim}", ADMIN)],
    "auth_api.api_user_update": [M("PATCH", "/api/v1/users/{victim}", ADMIN, {"role": "admin"},
                                   {"role": "bogus"})],
    "auth_api.api_tokens_list": [G("/api/v1/tokens", SIGNED_IN)],
    "auth_api.api_token_create": [P("/api/v1/tokens", SIGNED_IN, allow={"name": "walk"})],
    "auth_api.api_token_revoke": [M("DELETE", "/api/v1/tokens/{victim_token}", ADMIN,
                                    fresh="victim_token"),
                                  M("DELETE", "/api/v1/tokens/{my_token}", SIGNED_IN,
                                    fresh="my_token")],
    "tenants_api.api_tenants_list": [G("/api/v1/tenants", SIGNED_IN, hidden=OWN_NAME)],
    "tenants_api.api_tenant_create": [P("/api/v1/tenants", INFRA, {"name": "intruder"},
                                        {"name": ""})],
    "tenants_api.api_tenant_get": [G("/api/v1/tenants/{own}", SEES)],
    "tenants_api.api_tenant_update": [M("PATCH", "/api/v1/tenants/{own}", OPS_ON_TENANT,
                                        {"name": "renamed"}, {"name": ""})],
    "tenants_api.api_keys_list": [G("/api/v1/tenants/{own}/keys", SEES)],
    "tenants_api.api_key_create": [P("/api/v1/tenants/{own}/keys", OPS_ON_TENANT,
                                     {"name": "intruder"}, {"name": ""})],
    "tenants_api.api_key_get": [G("/api/v1/keys/{key}", SEES)],
    "tenants_api.api_key_revoke": [M("DELETE", "/api/v1/keys/{key}", OPS_ON_TENANT,
                                     fresh="key")],
    "catalog_api.api_tiers_list": [G("/api/v1/tiers", SIGNED_IN)],
    "catalog_api.api_tier_create": [P("/api/v1/tiers", INFRA,
                                      {**TIER_FORM, "name": "tier-new", "rank": 9,
                                       "enabled": True}, {"rank": "x"})],
    "catalog_api.api_tier_get": [G("/api/v1/tiers/{tier}", SIGNED_IN)],
    "catalog_api.api_tier_update": [M("PATCH", "/api/v1/tiers/{tier}", INFRA,
                                      {"model": "intruder"}, {"rank": "x"})],
    "catalog_api.api_pools_list": [G("/api/v1/pools", SIGNED_IN, hidden=NODE,
                                     hidden_from=TENANT_USERS)],
    "catalog_api.api_pool_create": [P("/api/v1/pools", INFRA,
                                      {**POOL_FORM, "options": {}, "desired_replicas": 1},
                                      {"name": ""})],
    "catalog_api.api_pool_get": [G("/api/v1/pools/{pool}", SIGNED_IN, hidden=NODE,
                                   hidden_from=TENANT_USERS)],
    "catalog_api.api_pool_update": [M("PATCH", "/api/v1/pools/{pool}", INFRA,
                                      {"model": "intruder"}, {"desired_replicas": "x"})],
    "pools_api.api_status": [G("/api/v1/pools/status", GLOBAL)],
    "pools_api.api_pool_action": [P("/api/v1/pools/{pool}/actions", INFRA, {"action": "stop"},
                                    {"action": "bogus"})],
    "pools_api.api_replica_action": [P("/api/v1/pools/replicas/{replica}/actions", INFRA,
                                       {"action": "stop"}, {"action": "bogus"})],
    "pools_api.api_pool_lora": [P("/api/v1/pools/{pool}/lora", INFRA,
                                  {"action": "unload", "lora_name": "x"},
                                  {"action": "load", "lora_name": ""})],
    "policies_api.api_policy_global_get": [G("/api/v1/policies/global", SIGNED_IN)],
    "policies_api.api_policy_global_update": [
        M(m, "/api/v1/policies/global", INFRA, {"margin_gamma": 0.5}, {"margin_gamma": "bogus"})
        for m in ("PATCH", "PUT")],
    "policies_api.api_policy_tenant_get": [G("/api/v1/tenants/{own}/policy", SEES)],
    "policies_api.api_policy_tenant_update": [
        M(m, "/api/v1/tenants/{own}/policy", OPS_ON_TENANT, {"max_tokens_cap": 100},
          {"margin_gamma": "bogus"}) for m in ("PATCH", "PUT")],
    "workflows_api.api_workflows_list": [G("/api/v1/workflows", SIGNED_IN, hidden=WF_NAME)],
    "workflows_api.api_workflow_get": [G("/api/v1/workflows/{wf}", SEES)],
    "workflows_api.api_workflow_update": [M("PATCH", "/api/v1/workflows/{wf}", OPS_ON_TENANT,
                                            {"name": "renamed"}, {"category": "bogus"})],
    "audit_api.api_audit_list": [G("/api/v1/audit", ADMIN)],
    "cache_api.api_invalidate": [P("/api/v1/cache/invalidate", OPS_ON_TENANT,
                                   {"scope": "tenant", "tenant_id": "{own}"},
                                   {"scope": "bogus"})],
    "drills_api.api_list": [G("/api/v1/drills", INFRA)],
    "drills_api.api_cache_poisoning": [P("/api/v1/drills/cache-poisoning", INFRA, {},
                                         {"threshold": 5})],
    "drills_api.api_domain_shift": [P("/api/v1/drills/domain-shift", INFRA,
                                      {"key": DRILL_KEY, "url": "http://127.0.0.1:9"},
                                      {"key": ""})],
    "drills_api.api_replica_loss": [P("/api/v1/drills/replica-loss", INFRA,
                                      {**DRILL, "pool_id": "{pool}"}, {"key": ""})],
    "finops_api.api_dashboard": [G("/api/v1/finops/dashboard?tenant={own}", SEES)],
    "finops_api.api_cohorts": [G("/api/v1/finops/cohorts?tenant={own}", SEES)],
    "finops_api.api_showback": [G("/api/v1/finops/showback?tenant={own}", SEES)],
    "finops_api.api_savings": [G("/api/v1/finops/savings?tenant={own}", SEES)],
    "finops_api.api_months": [G("/api/v1/finops/months?tenant={own}", SEES)],
    "finops_api.api_export": [G("/api/v1/finops/export/ledger.csv?tenant={own}", SEES)],
    "finops_api.api_budgets": [G("/api/v1/finops/budgets", SIGNED_IN, hidden=OWN_NAME)],
    "finops_api.api_budget_save": [
        M(m, "/api/v1/finops/budgets/{own}", BUDGET,
          {"monthly_limit_usd": "1", "action": "hard_stop"}, {"monthly_limit_usd": "-1"})
        for m in ("POST", "PUT")],
    "finops_api.api_budget_delete": [M("DELETE", "/api/v1/finops/budgets/{own}",
                                       CENTRAL_FINOPS, fresh="budget")],
    "finops_api.api_adjustment": [P("/api/v1/finops/adjustments", CENTRAL_FINOPS,
                                    {"tenant_id": "{own}", "amount": "-5", "reason": "x"},
                                    {"tenant_id": "{own}", "amount": "0", "reason": ""})],
    "finops_api.api_adjustment_requests": [G("/api/v1/finops/adjustments/requests", SIGNED_IN,
                                             hidden=ADJ_REASON)],
    "finops_api.api_adjustment_decision": [
        P("/api/v1/finops/adjustments/requests/{adj}/approve", CENTRAL_FINOPS,
          {"comment": "ok"}, {"comment": "walk"}, fresh="adj")],
    "finops_api.api_rebuild": [P("/api/v1/finops/rollups/rebuild", CENTRAL_FINOPS, {},
                                 {"period": "bogus"})],
    "ledger_api.api_dead_letters": [G("/api/v1/ledger/dead-letters", CENTRAL_FINOPS)],
    "ledger_api.api_dead_letters_replay": [P("/api/v1/ledger/dead-letters/replay",
                                             CENTRAL_FINOPS, {}, {"ids": "bogus"})],
    "finops_api.api_prices": [G("/api/v1/finops/prices", SIGNED_IN)],
    "finops_api.api_tier_price_add": [P("/api/v1/finops/tiers/{tier}/prices", CENTRAL_FINOPS,
                                        {"price_input_per_m": "9",
                                         "price_cached_input_per_m": "1",
                                         "price_output_per_m": "9"},
                                        {"price_input_per_m": "x"})],
    "finops_api.api_gpu_rate_add": [P("/api/v1/finops/gpu-rates", CENTRAL_FINOPS,
                                      {"gpu_type": "H100", "hourly_usd": "1"},
                                      {"gpu_type": "", "hourly_usd": "x"})],
    "cascade_api.api_scopes": [G("/api/v1/router/scopes", SIGNED_IN, hidden="tenant:{own}")],
    # another tenant's scope lists no versions (200, empty) rather than refusing
    "cascade_api.api_versions": [G("/api/v1/router/scopes/tenant:{own}/models", SIGNED_IN,
                                   hidden="trained_on")],
    "cascade_api.api_gamma": [P("/api/v1/router/gamma", INFRA, {
        "tier": "{tier}", "kind": "recall", "target": 0.5, "save": True,
        "traces": [{"margin": 0.1, "correct": False}, {"margin": 3.0, "correct": True}]},
        {"tier": "{tier}", "kind": "bogus"})],
    "cascade_api.api_set_taus": [P("/api/v1/router/models/{model}/taus", INFRA,
                                   {"quality_target": 0.99}, {"quality_target": "abc"})],
    "adapters_api.api_list": [G("/api/v1/adapters", SIGNED_IN, hidden=WF_NAME)],
    "adapters_api.api_get": [G("/api/v1/adapters/{ad_awaiting}", SEES)],
    "adapters_api.api_train": [P("/api/v1/adapters", OPS_ON_TENANT,
                                 {"tenant_id": "{own}", "workflow": WF_NAME},
                                 {"tenant_id": "{own}", "workflow": "wf-none"})],
    "adapters_api.api_act": [_act("approve", "ad_awaiting", APPROVE, api=True),
                             _act("rollback", "ad_canary", ROLLBACK, api=True),
                             _act("submit", "ad_candidate", OPS_ON_TENANT, api=True),
                             _act("cancel", "ad_training", OPS_ON_TENANT, api=True)],
}


# -- the world -------------------------------------------------------------------------------
@dataclass
class Actor:
    role: str | None            # None: signed out
    scope: str | None
    user_id: int | None = None
    web: object = None          # a console client, signed in
    csrf: str = ""
    api: dict = field(default_factory=dict)  # the bearer header

    @property
    def label(self) -> str:
        return "anonymous" if self.role is None else f"{self.role}/{self.scope}"


def _sign_in(app, role: str, tenant_id: int | None) -> Actor:
    """A new user of ``role``: a console client signed in through /login and an API token."""
    from app.auth.service import create_admin_token
    from app.extensions import db
    from app.tenants.models import Tenant
    from tests.factories import UserFactory
    with app.app_context():
        user = UserFactory(role=role, tenant=db.session.get(Tenant, tenant_id) if tenant_id
                           else None)
        uid, email = user.id, user.email
        _, token = create_admin_token(user, "route-walk")
    web = app.test_client()
    login(web, email)
    csrf = csrf_from(web.get("/tokens").get_data(as_text=True))
    return Actor(role, None, uid, web, csrf, {"Authorization": f"Bearer {token}"})


class World:
    """Two tenants and one of each object a route names, made once for the module."""

    def __init__(self, app):
        self.app = app
        self.ids: dict[str, int] = {}
        self.actors: list[Actor] = []

    def build(self) -> None:
        from app.auth.service import create_admin_token
        from app.catalog.service import sync_replica_rows
        from app.cascade import service as cascade
        from app.extensions import db
        from app.finops.models import Budget
        from app.workflows.service import ensure_workflow
        from tests.cascade.helpers import traces
        from tests.factories import (PoolFactory, TenantFactory, TierFactory, UserFactory,
                                     make_key)
        with self.app.app_context():
            own = TenantFactory(name=OWN_NAME)
            other = TenantFactory(name=OTHER_NAME)
            pool = PoolFactory(node=NODE)   # no worker consumes its queue
            sync_replica_rows(pool)
            db.session.commit()
            tier = TierFactory(name="tier-walk", rank=1, model="tiny")
            wf = ensure_workflow(own.id, hashlib.sha256(b"acme-walk").hexdigest(), WF_NAME)
            victim = UserFactory(role="viewer", tenant=own, email="victim@example.com")
            db.session.add(Budget(tenant_id=own.id, monthly_limit_usd=Decimal("100"),
                                  action="alert"))
            db.session.commit()
            model = cascade.train_scope(f"tenant:{own.id}", traces(800, seed=7))
            self.requester = UserFactory(role="finops").id   # asks; may not decide
            self.ids.update(own=own.id, other=other.id, pool=pool.id,
                            replica=pool.replicas[0].id, tier=tier.id, wf=wf.id,
                            victim=victim.id, model=model.id, key=make_key(own)[0].id)
            self.ids["victim_token"] = create_admin_token(victim, "victim")[0].id
            self.ids["my_token"] = self.ids["victim_token"]  # signed out: anyone's token
        for state in ("awaiting", "canary", "candidate", "training"):
            self.ids[f"ad_{state}"] = self.fresh(f"ad_{state}", None)
        self.ids["adj"] = self.fresh("adj", None)

    def fresh(self, what: str, actor: Actor | None) -> int:
        """A new object of kind ``what`` (the budget: put back if a call removed it)."""
        from app.adapters.models import Adapter
        from app.auth.models import User
        from app.auth.service import create_admin_token
        from app.extensions import db
        from app.finops.models import AdjustmentRequest, Budget
        from app.tenants.models import Tenant
        from tests.factories import make_key
        own = self.ids["own"]
        with self.app.app_context():
            if what == "key":
                return make_key(db.session.get(Tenant, own))[0].id
            if what == "victim_token":
                return create_admin_token(db.session.get(User, self.ids["victim"]), "v")[0].id
            if what == "my_token":
                return create_admin_token(db.session.get(User, actor.user_id), "mine")[0].id
            if what == "budget":
                if db.session.scalar(sa.select(Budget).where(Budget.tenant_id == own)) is None:
                    db.session.add(Budget(tenant_id=own, monthly_limit_usd=Decimal("100")))
                    db.session.commit()
                return own
            if what == "adj":
                req = AdjustmentRequest(tenant_id=own, amount_usd=Decimal("-2500"),
                                        reason=ADJ_REASON, requested_by_id=self.requester,
                                        requested_by="requester@example.com")
                db.session.add(req)
                db.session.commit()
                return req.id
            state = {"ad_awaiting": "awaiting_approval"}.get(what, what.removeprefix("ad_"))
            n = len(self.ids) + db.session.scalar(sa.select(sa.func.count(Adapter.id)))
            adapter = Adapter(tenant_id=own, workflow=f"walk{n:05d}", workflow_name=WF_NAME,
                              pool_id=self.ids["pool"], name=f"lora-walk-{n}",
                              base_model="smollm2-135m", state=state,
                              requested_by="system",
                              canary_pct=5 if state == "canary" else 0)
            db.session.add(adapter)
            db.session.commit()
            return adapter.id

    def snapshot(self) -> dict:
        """Every committed row of every table, and every Redis key of the test namespace."""
        from app.extensions import db
        from app.redis_client import get_redis
        with self.app.app_context():
            with db.engine.connect() as conn:
                rows = {t.name: sorted(map(repr, conn.execute(sa.select(t)).all()))
                        for t in db.metadata.sorted_tables}
            r = get_redis()
            ns = self.app.config["REDIS_NAMESPACE"]
            redis, expiring = {}, {}
            now = time.monotonic()
            for key in sorted(r.scan_iter(f"{ns}:*", count=1000)):
                if _DATA_PLANE.match(key.decode()[len(ns) + 1:]):
                    continue
                kind = r.type(key).decode()
                value = {"string": r.get, "list": lambda k: r.lrange(k, 0, -1),
                         "hash": r.hgetall, "set": lambda k: sorted(r.smembers(k)),
                         "zset": lambda k: r.zrange(k, 0, -1, withscores=True)
                         }.get(kind, lambda k: None)(key)
                redis[key] = repr(value)
                ttl_ms = r.pttl(key)
                if ttl_ms > 0:
                    expiring[key] = now + ttl_ms / 1000
        return {"rows": rows, "redis": redis, "expiring": expiring, "at": time.monotonic()}


# Keys the data plane writes (the session's shared gateway, engines and workers serving
# other tests' traffic beside this one): in-flight counters, template-lint counts, the
# ledger / feedback / trace streams, request owners, rate limits, S00 cache entries,
# replica stats; and kombu's binding tables and their deadlines, which the session's
# Celery workers refresh on their own schedule (seen: ``celery:_kombu.binding_deadlines``
# moving under a refused POST /logout). No console or API call writes them, and they move
# on their own; a task a call queues still shows (the queue's own list is checked).
_DATA_PLANE = re.compile(r"^(load\d*:|lint:|ledger:|feedback:|req:|ratelimit:|cache:|"
                         r"adapters:traces|replica:|gateway:|celery:_kombu\.binding)")


def _changes(before: dict, after: dict) -> list[str]:
    out = [f"table {t}" for t in before["rows"] if before["rows"][t] != after["rows"].get(t)]
    keys = set(before["redis"]) | set(after["redis"])
    # a key that was due to expire (an earlier test's sign-in failure count, say) and is
    # gone is its TTL's doing, not the call's
    expired = {k for k in set(before["redis"]) - set(after["redis"])
               if before["expiring"].get(k, float("inf")) <= after["at"] + 1.0}
    out += [f"redis {k!r}" for k in sorted(keys - expired)
            if before["redis"].get(k) != after["redis"].get(k)]
    return out


@pytest.fixture(scope="module")
def route_world(_app):
    from app.extensions import db
    _app.extensions["celery"].set_default()
    _app.extensions["celery"].set_current()
    w = World(_app)
    try:
        w.build()
        anon = _app.test_client()
        w.actors.append(Actor(None, None, web=anon,
                              csrf=csrf_from(anon.get("/login").get_data(as_text=True))))
        tenant_of = {"global": None, "own": w.ids["own"], "other": w.ids["other"]}
        for role in ROLES:
            for scope in SCOPES:
                w.actors.append(replace(_sign_in(_app, role, tenant_of[scope]), scope=scope))
        yield w
    finally:
        with _app.app_context():
            db.session.remove()
            with db.engine.begin() as conn:
                for table in reversed(db.metadata.sorted_tables):
                    conn.execute(table.delete())


# -- the walk --------------------------------------------------------------------------------
def _fill(value, ids: dict):
    if isinstance(value, str):
        if value.startswith("{") and value.endswith("}") and value[1:-1] in ids:
            return ids[value[1:-1]]
        return re.sub(r"\{(\w+)\}", lambda m: str(ids.get(m[1], m[0])), value)
    return value


def _send(world: World, actor: Actor, walk: Walk, ids: dict, body: dict | None):
    """The request, its (streamed) body read and the response closed."""
    resp = _open(actor, walk, ids, body)
    resp.get_data()
    resp.close()
    return resp


def _open(actor: Actor, walk: Walk, ids: dict, body: dict | None):
    url = walk.url.format(**ids)
    api = url.startswith("/api/")
    client = actor.web
    if api:
        headers = actor.api
        kw = {} if walk.method in ("GET", "DELETE") else {
            "json": {k: _fill(v, ids) for k, v in (body or {}).items()}}
        return client.open(url, method=walk.method, headers=headers, **kw)
    if walk.method == "GET":
        return client.get(url)
    data = {k: str(_fill(v, ids)) for k, v in (body or {}).items()}
    return client.open(url, method=walk.method, data={**data, "csrf_token": actor.csrf})


def _to_login(resp) -> bool:
    return resp.status_code == 302 and "/login" in resp.headers.get("Location", "")


def _denied_ok(actor: Actor, api: bool, resp) -> bool:
    if actor.role is None:
        return resp.status_code == 401 if api else _to_login(resp)
    return resp.status_code in (403, 404)


def _allowed_problem(walk: Walk, api: bool, resp, hidden: str | None, actor: Actor) -> str:
    status = resp.status_code
    if status >= 500 or status in (401, 403):
        return f"answered {status}"
    if status == 404:
        return "answered 404"
    if not api and actor.role is not None and walk.url not in ("/login", "/logout") \
            and _to_login(resp):
        return "was sent to /login"
    if hidden and actor.scope in walk.hidden_from and hidden in resp.get_data(as_text=True):
        return f"sees {hidden!r}"
    return ""


def _throwaway(world: World, actor: Actor) -> Actor:
    tenant = {"global": None, "own": world.ids["own"], "other": world.ids["other"]}
    return replace(_sign_in(world.app, actor.role, tenant[actor.scope]), scope=actor.scope)


def _walk(world: World, walk: Walk) -> list[str]:
    """Denied callers first (nothing may change), then the allowed ones; the failures."""
    api = walk.url.startswith("/api/")
    ids = dict(world.ids)
    failures = []
    denied = [a for a in world.actors if not walk.rule.allows(a.role, a.scope)]
    before = world.snapshot()
    for actor in denied:
        resp = _send(world, actor, walk, ids, walk.deny)
        if not _denied_ok(actor, api, resp):
            failures.append(f"{walk.method} {walk.url} as {actor.label}: denied by rule "
                            f"'{walk.rule.name}' but answered {resp.status_code}")
    changed = _changes(before, world.snapshot())
    if changed:
        failures.append(f"{walk.method} {walk.url}: refused calls changed {changed}")
    hidden = walk.hidden and walk.hidden.format(**ids)
    shown = False
    for actor in (a for a in world.actors if walk.rule.allows(a.role, a.scope)):
        call_ids = dict(ids)
        if walk.fresh:
            call_ids[walk.fresh] = world.fresh(walk.fresh, actor)
        caller = _throwaway(world, actor) if walk.own_session and actor.role else actor
        resp = _send(world, caller, walk, call_ids, walk.allow)
        shown = shown or bool(hidden and hidden in resp.get_data(as_text=True))
        problem = _allowed_problem(walk, api, resp, hidden, actor)
        if problem:
            failures.append(f"{walk.method} {walk.url} as {actor.label}: allowed by rule "
                            f"'{walk.rule.name}' but {problem}")
    if hidden and not shown:   # else the marker proves nothing
        failures.append(f"{walk.method} {walk.url}: nobody sees the marker {hidden!r}")
    if walk.fresh == "budget":
        world.fresh("budget", None)   # the next routes find the budget again
    return failures


def _methods(rule) -> set[str]:
    return set(rule.methods) - {"HEAD", "OPTIONS"}


def test_every_route_has_a_rule(_app):
    """A route without a rule, a rule without a route, or a method nobody walks."""
    routes: dict[str, set[str]] = {}
    for rule in _app.url_map.iter_rules():
        routes.setdefault(rule.endpoint, set()).update(_methods(rule))
    missing = sorted(set(routes) - set(RULES))
    stale = sorted(set(RULES) - set(routes))
    unwalked = sorted(f"{e} {m}" for e in set(routes) & set(RULES)
                      for m in routes[e] - {w.method for w in RULES[e]})
    assert not missing, f"routes without a rule in RULES: {missing}"
    assert not stale, f"RULES for routes that no longer exist: {stale}"
    assert not unwalked, f"methods no walk covers: {unwalked}"
    assert len(routes) >= 125


@pytest.mark.parametrize("endpoint", sorted(RULES))
def test_route_is_used_only_by_whom_its_rule_allows(route_world, endpoint):
    failures = [f for walk in RULES[endpoint] for f in _walk(route_world, walk)]
    assert not failures, "\n".join(failures)


def test_the_walk_covers_every_role_scope_and_a_signed_out_visitor(route_world):
    labels = {a.label for a in route_world.actors}
    assert labels == {"anonymous"} | {f"{r}/{s}" for r in ROLES for s in SCOPES}
    walks = sum(len(ws) for ws in RULES.values())
    assert walks * len(route_world.actors) > 2000
