"""The form an adapter is served in, so it learns that form.

A routed tier-1 request reaches the engine as S02 leaves it (``app.gateway.stages.
s02_minify``): with the tenant's ``minify_enabled`` and a ``json_schema`` response format,
the schema's keys become one-token aliases in the pool model's tokenizer, the instructions
that name them are rewritten, and on a pool with ``minify_compact_json`` the schema goes as
a compact grammar with one style-hint line in the system message. A trace holds the
client's form (full keys, the frontier's answer as the client got it). An adapter trained
on that form and then served the aliases writes its learned key where the grammar wants a
value: the replay's invoice adapter, trained on ``supplier_legal_entity_name``, answered
``"entity":"legal"`` under the alias ``entity`` (bench/results/replay.txt).

``to_served`` turns a dataset record into the served form: the messages as S02 rewrites
them, the minified ``response_format``, and the answer with the aliases, written compactly
(what a model following the grammar writes). The offline evaluation then compares the
adapter's answer with that reference, alias for alias, within the same token budget the
live path gives it. Records S02 would not minify are left as they are. The aliases are
fixed by the policy at freeze time; the record says which (``served_form``).

The adapter keeps those policy fields (``app.contract.policy.FORM_FIELDS``, ``form_of``:
``Adapter.form``) and is served in that form for as long as it serves, whatever the
tenant's policy says later (``app.gateway.stages.s02_minify.trained_form``): an adapter
trained on aliases and then sent full keys (minify turned off) wrote aliases where the
client's keys belonged, and every one of its answers failed (bench/results/replay.txt, the
ablation's no_minify pass).
The client's answer is expanded back to its keys either way.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from app.contract.policy import form_differs


def pool_tokenizer(pool) -> str:
    """The token counter S02 uses for a pool tier (``request_facts.pool_tokenizer``)."""
    from app.gateway.request_facts import pool_tokenizer as rule
    return rule(getattr(pool, "engine", None), getattr(pool, "model", "") or "")


def to_served(record: dict[str, Any], policy: Mapping[str, Any], tokenizer: str
              ) -> dict[str, Any]:
    """``record`` ({messages, response_format, answer, ...}) as tier 1 is served it."""
    rf = record.get("response_format")
    if not policy.get("minify_enabled") or not isinstance(rf, dict) \
            or rf.get("type") != "json_schema":
        return record
    try:
        answer = json.loads(record["answer"])
    except (TypeError, ValueError):
        return record   # not JSON: the served form would not parse either
    from app.core.minify import minify_json
    from app.gateway.stages.s02_minify import minify_request
    got = minify_request({"messages": record["messages"], "response_format": rf}, policy,
                         tokenizer, pool=True)
    if got is None or got[1].keymap is None:
        return record
    body, st = got
    aliases = {o if p in ("", "$") else f"{p}.{o}": a for p, o, a in st.keymap.renames}
    return {**record, "messages": body["messages"], "response_format": st.response_format,
            "answer": json.dumps(minify_json(answer, st.keymap), ensure_ascii=False,
                                 separators=(",", ":")),
            "served_form": {"tokenizer": st.tokenizer, "aliases": aliases,
                            "compact": st.compact}}


def served_form(policy: Mapping[str, Any], pool) -> Callable[[dict], dict]:
    """``to_served`` bound to a tenant's policy and the tier-1 pool."""
    tokenizer = pool_tokenizer(pool)
    return lambda record: to_served(record, policy, tokenizer)


def describe(form: Mapping[str, Any], policy: Mapping[str, Any] | None = None
             ) -> tuple[str, list[str]]:
    """(the served form in words, the form fields where ``policy`` now differs) for the
    adapter page: an ML engineer sees that the adapter keeps its form, and why a retrain
    would learn another."""
    if not form:
        return "not recorded (trained before forms were kept): served as the policy says", []
    if not form.get("minify_enabled"):
        text = "full keys, as the client sends them (minify was off)"
    else:
        bits = [f"{form.get('minify_alias_style') or 'semantic'} aliases"]
        if form.get("minify_enums"):
            bits.append("enums")
        if form.get("minify_compact_json"):
            bits.append("compact JSON")
        if form.get("minify_style_hint"):
            bits.append("style hint")
        text = "minified keys: " + ", ".join(bits)
    return text, form_differs(form, policy) if policy is not None else []
