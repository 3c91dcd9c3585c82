"""Policy fields, their defaults (the seed's numbers) and validation. Pure: no I/O."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


# What a tenant-scoped user (ops of one department) may do with a field of their own
# tenant's policy. Global users set anything within the field's range.
TENANT_FREE = "free"            # their own choice: it changes only their own traffic's cost
TENANT_CENTRAL = "central"      # shared machinery or calibrated centrally: read-only to them
TENANT_UP = "up"                # only at or above the central value (stricter / safer)
TENANT_DOWN = "down"            # only at or below it (0 counts as "none" where it means unlimited)
TENANT_SPECIAL = "special"      # checked by its own rule in ``beyond_bounds``

_CENTRAL_WHY = {
    "router_tau_1": "calibrated on every router promotion to hold the quality target",
    "router_tau_2": "calibrated on every router promotion to hold the quality target",
    "router_max_regret": "the central quality bound every promotion is held to",
    "margin_gamma": "calibrated per model and tier on labelled traces",
    "margin_window_tokens": "part of the margin monitor's calibration",
    "bounded_load_factor": "shapes load on pools other tenants share",
    "prefix_key_tokens": "shapes replica choice on pools other tenants share",
    "replica_choice": "shapes replica choice on pools other tenants share",
    "explore_pct": "spends shared tier-1 capacity on exploration",
}


@dataclass(frozen=True)
class Field:
    kind: type | str            # bool, int, float, str, "tiers"
    default: Any
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()
    help: str = ""
    tenant: str = TENANT_FREE   # what a tenant-scoped user may do with it (TENANT_*)


FIELDS: dict[str, Field] = {
    "cache_enabled": Field(bool, True, help="Serve exact and semantic cache hits"),
    "cache_similarity_threshold": Field(float, 0.965, 0.5, 1.0,
                                        help="Cosine similarity needed for a semantic hit", tenant=TENANT_UP),
    "cache_ttl_s": Field(int, 86400, 0, 30 * 86400, help="Seconds a cached answer lives", tenant=TENANT_DOWN),
    "cache_max_temperature": Field(float, 0.0, 0.0, 2.0,
                                   help="Requests above this temperature are not cached", tenant=TENANT_DOWN),
    # verified cache (issue 22): reworded questions, judged by the verifier
    "cache_verified_only": Field(bool, True, tenant=TENANT_UP, help=(
        "Paraphrases get only verified answers (a validator passed it, a fresh answer "
        "agreed, or it was produced twice identically); others serve exact repeats only")),
    "cache_verify_floor": Field(float, 0.80, 0.5, 1.0, tenant=TENANT_UP, help=(
        "Lowest cosine at which a reworded question the verifier judges the same may be "
        "served (the tenant's line is learned from evidence at or above it)")),
    "cache_error_bound": Field(float, 0.001, 0.0, 0.5, tenant=TENANT_DOWN, help=(
        "Share of verified-path hits that may be wrong (95% confidence); the line holds it")),
    "cache_verify_sample_pct": Field(float, 5.0, 0.0, 100.0, tenant=TENANT_UP, help=(
        "Percent of verifier-path hits also generated upstream in the background (the "
        "client still gets the cached answer) to check it; booked as cache verification, "
        "on no budget")),
    "router_tau_1": Field(float, 0.80, 0.0, 1.0,
                          help="Calibrated P(tier 1 meets the bar) needed to use tier 1", tenant=TENANT_CENTRAL),
    "router_tau_2": Field(float, 0.70, 0.0, 1.0,
                          help="Calibrated P(tier 2 meets the bar) needed to use tier 2", tenant=TENANT_CENTRAL),
    "margin_gamma": Field(float, 0.78, 0.0, 20.0,
                          help="Mean top-1/top-2 logprob margin below which a tier escalates", tenant=TENANT_CENTRAL),
    "margin_window_tokens": Field(int, 12, 1, 4096,
                                  help="Value tokens the margin monitor waits for", tenant=TENANT_CENTRAL),
    "bounded_load_factor": Field(float, 1.25, 1.0, 10.0,
                                 help="Skip a replica loaded above this times the mean", tenant=TENANT_CENTRAL),
    "max_tokens_cap": Field(int, 4096, 1, 1_000_000, help="Upper bound on max_tokens", tenant=TENANT_SPECIAL),
    "minify_enabled": Field(bool, True, help="Minify JSON schema keys on the way up"),
    "minify_tools": Field(bool, False, help="Also minify tool/function parameter schemas"),
    # semantic value aliases (HIGH_PRIORITY_SERVICE_DOWN -> high): 4% fewer generated tokens
    # than keys alone, fields right within the run-to-run spread (minify_quality.txt)
    "minify_enums": Field(bool, True,
                          help="Also alias multi-token enum values (where only enum values fit)"),
    # semantic: same token reduction as letters on the corpus (bench/results/minify.txt),
    # 24/50 vs 10/50 fields right on SmolLM2 (bench/results/minify_quality.txt)
    "minify_alias_style": Field(str, "semantic", choices=("semantic", "letters"),
                                help="Key aliases: a one-token word of each key (semantic), "
                                     "or a, b, c..."),
    # separators are 13% of the corpus's output tokens (bench/results/minify.txt)
    "minify_compact_json": Field(bool, True,
                                 help="Pool tiers: constrain JSON answers to ',' and ':' "
                                      "separators (a grammar instead of json_schema)"),
    # the grammar fixes characters, not tokens: without the hint SmolLM2 wrote '":' '"'
    # for '":"' (bench/results/minify_quality.txt)
    "minify_style_hint": Field(bool, True,
                               help="Pool tiers with compact JSON: one instruction line that "
                                    "shows the compact style"),
    "schema_error_action": Field(str, "retry", choices=("retry", "mark"),
                                 help="On a schema error: retry unminified, or mark"),
    "frontier_first_hours": Field(int, 48, 0, 24 * 365,
                                  help="New workflows go to the frontier tier this long", tenant=TENANT_UP),
    # the seed's S01_DEFAULT_TIER2 sends a scope with no router to tier 2 before anything
    # shows that tier 2 passes its traffic; on: the frontier until a router version is
    # promoted (app.cascade.regret holds that one to router_max_regret)
    "frontier_until_router": Field(bool, False, tenant=TENANT_UP, help=(
        "Auto requests of a workflow past its warm-up go to the frontier, not tier 2, until "
        "a router version for it is promoted (the workflow's own: a tenant-wide router is not "
        "asked for a workflow's requests)")),
    "distill_min_traces": Field(int, 2500, 1, 10_000_000,
                                help="Verified traces needed before LoRA training", tenant=TENANT_UP),
    "shadow_concordance": Field(float, 0.99, 0.5, 1.0,
                                help="Shadow agreement needed to promote an adapter", tenant=TENANT_UP),
    # automatic rollback of a canary / promoted adapter (app.adapters.watch): only on a
    # regression that its live traffic shows with 95% confidence (Wilson bounds)
    "canary_max_error_rate": Field(float, 0.02, 0.0, 1.0,
                                   help="Roll an adapter back when its upstream error rate is "
                                        "above this", tenant=TENANT_DOWN),
    "canary_min_pass_rate": Field(float, 0.95, 0.0, 1.0,
                                  help="Roll an adapter back when the validator/feedback pass "
                                       "rate of its answers is below this", tenant=TENANT_UP),
    # exploration for the router's labels (app.gateway.shadow): tier 1 also answers this
    # share of the requests a higher tier served, off the path and off the budget, so the
    # router learns where tier 1 would have passed
    "explore_pct": Field(float, 5.0, 0.0, 100.0,
                         help="Share (%) of requests served above tier 1 that tier 1 also "
                              "answers off the path, for the router's labels (0: off)", tenant=TENANT_CENTRAL),
    # the seed's bound E[Regret] <= 0.008 (app.cascade.regret): a router version is
    # promoted with the τ whose 95% upper bound on regret stays within this
    "router_max_regret": Field(float, 0.008, 0.0, 1.0,
                               help="Most share of requests a promoted router may send to a "
                                    "tier that fails where the frontier passes (95% bound)", tenant=TENANT_CENTRAL),
    "allowed_tiers": Field("tiers", [], help="Tier names this tenant may call (empty: all)", tenant=TENANT_SPECIAL),
    "allow_explicit_tier": Field(bool, True, help="Let clients name a tier instead of auto", tenant=TENANT_SPECIAL),
    # on by default: with a shared prefix cache, usage.cached_tokens tells a tenant whether
    # another tenant sent the same prompt prefix (turn off to share a public system prompt)
    "cache_salt": Field(bool, True, help="Isolate this tenant's engine prefix cache"),
    "session_key": Field(str, "header", choices=("header", "user", "both"),
                         help="Where the session id for replica affinity comes from"),
    "prefix_key_tokens": Field(int, 4500, 16, 1_000_000,
                               help="Static-prefix tokens hashed for replica choice", tenant=TENANT_CENTRAL),
    "replica_choice": Field(str, "sluice", choices=("sluice", "kv_events", "round_robin"),
                            help="Replica choice: rendezvous on session/prefix with bounded "
                                 "load; kv_events: the replica whose KV cache (from the "
                                 "engines' own events) holds most of the prompt, within the "
                                 "same load bound; or round-robin (a baseline to compare "
                                 "with)", tenant=TENANT_CENTRAL),
    "rate_limit_rpm": Field(int, 0, 0, 10_000_000, help="Requests per minute (0: unlimited)", tenant=TENANT_SPECIAL),
    # tool-definition retrieval (app.core.tool_select): an agent with 50 tools pays ~10k
    # prompt tokens a turn for schemas; it changes only this tenant's own requests
    "tool_retrieval": Field(bool, False,
                            help="Requests with more than tool_retrieval_k tools send only the "
                                 "relevant ones: the tool choice, tools called earlier, pinned "
                                 "tools, then the most similar to the user's turns",
                            tenant=TENANT_FREE),
    "tool_retrieval_k": Field(int, 6, 1, 128, help="Tools sent when retrieval applies (the "
                                                   "choice, called and pinned ones may exceed it)",
                              tenant=TENANT_FREE),
    "tool_retrieval_stubs": Field(int, 0, 0, 128,
                                  help="Tools sent as stubs past the full ones (name, one-line "
                                       "description, parameter names and types): the next "
                                       "best scored; a stub called with arguments its full "
                                       "schema rejects is retried with the full definition",
                                  tenant=TENANT_FREE),
    "tool_retrieval_full": Field(int, 0, 0, 128,
                                 help="Of the best scored tools sent, how many go with their "
                                      "full definitions; the others go as stubs (0: all in "
                                      "full). The choice, called and pinned tools and the "
                                      "lookups they need always go in full",
                                 tenant=TENANT_FREE),
    "tool_retrieval_names": Field(int, 0, 0, 128,
                                  help="Tools sent by name alone past the stubs (no "
                                       "description or parameters, ~15 tokens each): the "
                                       "next best scored; one called with arguments its "
                                       "full schema rejects is retried with the full "
                                       "definition",
                                  tenant=TENANT_FREE),
    "tool_retrieval_pinned": Field(str, "", help="Tools always sent (comma-separated names)",
                                   tenant=TENANT_FREE),
    "tool_retrieval_workflows": Field(str, "",
                                      help="Only these workflows (comma-separated names or "
                                           "signatures; empty: every workflow)",
                                      tenant=TENANT_FREE),
}

DEFAULTS: dict[str, Any] = {name: f.default for name, f in FIELDS.items()}

# The policy fields that can change the text of an answer, by what in a request they act on
# (app.contract.cache.keys.policy_hash puts them in the cache key), and ROUTING_FIELDS: the
# ones that decide only whether, where or by which tier a request is served, how a cache
# lookup matches, or what the flywheel learns. Editing one of those (exploration, τ, the
# warm-up, a rate limit) must not orphan a tenant's cached answers. The two partition
# FIELDS (a test holds it): a field in neither counts as answer-shaping everywhere.
ANSWER_FIELDS: dict[str, tuple[str, ...]] = {
    "any": ("max_tokens_cap",),
    "schema": ("minify_enabled", "minify_enums", "minify_alias_style", "minify_compact_json",
               "minify_style_hint", "schema_error_action"),
    "tools": ("minify_enabled", "minify_tools", "minify_enums", "minify_alias_style",
              "minify_compact_json", "minify_style_hint", "tool_retrieval", "tool_retrieval_k",
              "tool_retrieval_stubs", "tool_retrieval_full", "tool_retrieval_names",
              "tool_retrieval_pinned", "tool_retrieval_workflows"),
}
ROUTING_FIELDS = frozenset((
    "cache_enabled", "cache_similarity_threshold", "cache_ttl_s", "cache_max_temperature",
    "cache_verified_only", "cache_verify_floor", "cache_error_bound", "cache_verify_sample_pct",
    "router_tau_1", "router_tau_2", "margin_gamma", "margin_window_tokens",
    "bounded_load_factor", "frontier_first_hours", "frontier_until_router",
    "distill_min_traces", "shadow_concordance", "canary_max_error_rate",
    "canary_min_pass_rate", "explore_pct", "router_max_regret", "allowed_tiers",
    "allow_explicit_tier", "cache_salt", "session_key", "prefix_key_tokens", "replica_choice",
    "rate_limit_rpm"))

# The fields that decide the form S02 gives a schema request on a pool tier. An adapter
# keeps them as they were when its dataset froze and is served in that form for good
# (app.adapters.served_form; the gateway's s02_minify.trained_form).
FORM_FIELDS = ("minify_enabled", "minify_enums", "minify_alias_style", "minify_compact_json",
               "minify_style_hint")


def form_of(policy: Mapping[str, Any]) -> dict[str, Any]:
    """The served form a policy gives (its ``FORM_FIELDS``), as an adapter keeps it."""
    return {f: policy.get(f) for f in FORM_FIELDS}


def form_differs(form: Mapping[str, Any], policy: Mapping[str, Any]) -> list[str]:
    """The ``FORM_FIELDS`` a kept ``form`` has where ``policy`` now says otherwise (none
    for an empty form: an adapter from before forms were kept)."""
    return [f for f in FORM_FIELDS if f in form and policy.get(f) != form[f]]



def _coerce(name: str, f: Field, raw: Any) -> Any:
    if f.kind is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.lower() in {"true", "1", "on", "yes", "y"}:
            return True
        if isinstance(raw, str) and raw.lower() in {"false", "0", "off", "no", "n", ""}:
            return False
        raise ValueError("must be true or false")
    if f.kind is int:
        if isinstance(raw, bool):
            raise ValueError("must be a whole number")
        try:
            val = int(raw) if not isinstance(raw, float) or raw.is_integer() else None
        except (TypeError, ValueError):
            val = None
        if val is None:
            raise ValueError("must be a whole number")
        return val
    if f.kind is float:
        if isinstance(raw, bool):
            raise ValueError("must be a number")
        try:
            return float(raw)
        except (TypeError, ValueError):
            raise ValueError("must be a number") from None
    if f.kind is str:
        if not isinstance(raw, str):
            raise ValueError("must be text")
        return raw
    if f.kind == "tiers":
        if isinstance(raw, str):
            raw = [t.strip() for t in raw.split(",") if t.strip()]
        if not isinstance(raw, list) or not all(isinstance(t, str) for t in raw):
            raise ValueError("must be a list of tier names")
        return raw
    raise AssertionError(name)


def validate(values: Mapping[str, Any], *, base: Mapping[str, Any] | None = None,
             known_tiers: set[str] | None = None) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """Coerce and check a (partial) policy.

    Returns (clean values, field errors). Cross-field rules are checked on the
    merge of ``base`` (the policy this one overrides) and the new values.
    """
    clean: dict[str, Any] = {}
    errors: dict[str, list[str]] = {}
    for name, raw in values.items():
        f = FIELDS.get(name)
        if f is None:
            errors.setdefault(name, []).append("unknown policy field")
            continue
        try:
            val = _coerce(name, f, raw)
        except ValueError as exc:
            errors.setdefault(name, []).append(str(exc))
            continue
        if f.lo is not None and val < f.lo or f.hi is not None and val > f.hi:
            errors.setdefault(name, []).append(f"must be between {f.lo:g} and {f.hi:g}")
            continue
        if f.choices and val not in f.choices:
            errors.setdefault(name, []).append(f"must be one of {', '.join(f.choices)}")
            continue
        if f.kind == "tiers" and known_tiers is not None:
            unknown = [t for t in val if t not in known_tiers]
            if unknown:
                errors.setdefault(name, []).append(f"unknown tiers: {', '.join(unknown)}")
                continue
        clean[name] = val
    merged = {**DEFAULTS, **(base or {}), **clean}
    if not errors and merged["router_tau_1"] < merged["router_tau_2"]:
        errors.setdefault("router_tau_1", []).append(
            "router_tau_1 must be at least router_tau_2 (the cheaper tier needs more confidence)")
    return clean, errors


def beyond_bounds(values: Mapping[str, Any], central: Mapping[str, Any]
                  ) -> dict[str, list[str]]:
    """Fields of a tenant-scoped user's ``values`` that go past what the central (global)
    policy allows, by each field's ``tenant`` rule: a central field set to anything but
    the central value, an UP field below it, a DOWN field above it; and the special
    ones: tiers outside the central set (an empty list means every tier), a rate limit or
    token cap above the central one (rate 0 = unlimited), or explicit tiers the central
    policy forbids."""
    out: dict[str, list[str]] = {}
    for name, value in values.items():
        f = FIELDS.get(name)
        if f is None or value is None:
            continue
        top = central.get(name, f.default)
        if f.tenant == TENANT_CENTRAL and value != top:
            out[name] = [f"set centrally ({_CENTRAL_WHY.get(name, 'shared')}): {top}"]
        elif f.tenant == TENANT_UP and value < top:
            out[name] = [f"central bound: at least {top:g}"]
        elif f.tenant == TENANT_DOWN and value > top:
            out[name] = [f"central bound: at most {top:g}"]
    if "allowed_tiers" in values:
        mine, theirs = set(values["allowed_tiers"]), set(central["allowed_tiers"])
        if theirs and (not mine or not mine <= theirs):
            out["allowed_tiers"] = [f"central bound: a subset of {', '.join(sorted(theirs))}"]
    rpm, top = values.get("rate_limit_rpm"), central["rate_limit_rpm"]
    if rpm is not None and top and not 1 <= rpm <= top:
        out["rate_limit_rpm"] = [f"central bound: 1 to {top} per minute"]
    cap = values.get("max_tokens_cap")
    if cap is not None and cap > central["max_tokens_cap"]:
        out["max_tokens_cap"] = [f"central bound: at most {central['max_tokens_cap']}"]
    if values.get("allow_explicit_tier") and not central["allow_explicit_tier"]:
        out["allow_explicit_tier"] = ["central bound: explicit tiers are off"]
    return out


def effective(global_values: Mapping[str, Any] | None,
              tenant_values: Mapping[str, Any] | None) -> dict[str, Any]:
    """Defaults, overridden by the global policy, overridden by the tenant's."""
    return {**DEFAULTS, **(global_values or {}), **(tenant_values or {})}


def tenant_rule(name: str, central: Mapping[str, Any]) -> tuple[str, str]:
    """(rule, what a tenant-scoped user is told) for the policy form."""
    f = FIELDS[name]
    top = central.get(name, f.default)
    if f.tenant == TENANT_CENTRAL:
        return f.tenant, f"Set centrally: {_CENTRAL_WHY.get(name, 'shared')}."
    if f.tenant == TENANT_UP:
        return f.tenant, f"You may raise it (stricter), not go below {top:g}."
    if f.tenant == TENANT_DOWN:
        return f.tenant, f"You may lower it (stricter), not go above {top:g}."
    if f.tenant == TENANT_SPECIAL:
        return f.tenant, "You may narrow it within the central bound."
    return f.tenant, ""
