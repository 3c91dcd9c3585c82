"""S02_SCHEMA_MINIFY: rewrite verbose JSON-schema keys (``response_format`` and, with the
policy's ``minify_tools``, tool parameters) to short one-token aliases before decode,
and the instructions that mention them (``app.core.minify``); with the policy's
``minify_enums``, multi-token enum values where only enum values fit, too. The policy's
``minify_alias_style`` picks the aliases: a word of each key (``semantic``) or letters.
With ``minify_compact_json`` a pool tier (vLLM or the reference engine) gets the minified
schema as an EBNF grammar with compact separators (``structured_outputs.grammar``, in
place of ``response_format``; ``app.core.minify_compact``), so separators cost no spaces;
external tiers keep ``response_format`` (an OpenAI API takes no grammar). With
``minify_style_hint`` the instructions then get one line that shows the compact style, so
the model more often writes the tokenizer's own ``":"`` / ``","`` tokens rather than
``'":'`` + ``'"'``.

With the tenant's ``tool_retrieval``, S02 first keeps only the relevant tools
(``app.gateway.tool_retrieval``); it books the tool-definition tokens sent either way.

Sets ``ctx.upstream_body`` and ``ctx.minify`` (key map, the minified schema, tool key
maps, the tokenizer, the original body for S05's retry). Fallback S02_PASSTHROUGH (also
taken when there is nothing to minify) sends the body as is. The minifier and the
tokenizer are CPU work (the first SmolLM2 tokenizer load takes seconds), so they run in
a worker thread; tokenizers are cached per process.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import anyio

from app.contract.policy import form_differs
from app.gateway.context import RequestContext
from app.gateway.request_facts import tokenizer_name



@dataclass
class MinifyState:
    keymap: Any                       # KeyMap of response_format (None: tools only)
    schema: dict | None               # the minified JSON schema the upstream must follow
    tool_maps: dict = field(default_factory=dict)   # function name -> KeyMap
    tokenizer: str = ""
    original_body: dict = field(default_factory=dict)
    alias_style: str = ""
    compact: bool = False             # the upstream was held to compact separators
    response_format: dict | None = None   # the minified response_format (compact replaces it)
    messages: list | None = None      # the rewritten messages before the style hint


def _source(ctx: RequestContext) -> dict:
    """The body S02 starts from: the client's, with only the retrieved tools when the
    tenant's tool retrieval chose some (``app.gateway.tool_retrieval``)."""
    return ctx.tools_body if ctx.tools_body is not None else ctx.body


def _wants(ctx: RequestContext) -> bool:
    if not ctx.policy["minify_enabled"]:
        return False
    rf = ctx.body.get("response_format")
    if isinstance(rf, dict) and rf.get("type") == "json_schema":
        return True
    return bool(ctx.policy.get("minify_tools") and ctx.body.get("tools"))


def _minify(ctx: RequestContext, name: str) -> MinifyState | None:
    got = minify_body(ctx, name, (ctx.tier or {}).get("upstream_kind") == "pool")
    if got is None:
        return None
    ctx.upstream_body, state = got
    return state


def minify_body(ctx: RequestContext, name: str, pool: bool
                ) -> tuple[dict, MinifyState] | None:
    """(the body to send, its MinifyState) for a tier counted by tokenizer ``name``, a
    pool or not; None when there is nothing to minify. Leaves ``ctx`` as it is (the
    off-path probes ask it for tier 1: ``app.gateway.shadow.routed_for``)."""
    return minify_request(_source(ctx), ctx.policy, name, pool)


def minify_request(source: dict, policy, name: str, pool: bool
                   ) -> tuple[dict, MinifyState] | None:
    """``minify_body`` for a request body and a policy, no request context (an adapter's
    dataset is frozen in this form: ``app.adapters.served_form``)."""
    from app.core.minify import (MinifyOptions, minify_response_format, minify_tools,
                                 rewrite_messages)
    from app.contract.tokenizers import get_counter
    counter = get_counter(name)
    options = MinifyOptions(
        minify_enums=bool(policy["minify_enums"]),
        alias_style=policy["minify_alias_style"])
    body = dict(source)
    keymap = schema = new_rf = None
    res = minify_response_format(body.get("response_format"), tokenizer=counter,
                                 options=options)
    if res is not None:
        new_rf, keymap = res
        body["response_format"] = new_rf
        body["messages"] = rewrite_messages(body["messages"], keymap)
        schema = new_rf["json_schema"]["schema"]
    tool_maps: dict = {}
    if policy.get("minify_tools") and isinstance(body.get("tools"), list):
        body["tools"], tool_maps = minify_tools(body["tools"], tokenizer=counter,
                                                options=options)
    if keymap is None and not tool_maps:
        return None
    messages = body["messages"]
    compact = schema is not None and pool and _compact(policy, body, schema)
    return body, MinifyState(keymap, schema, tool_maps, counter.name, source,
                             options.alias_style, compact, new_rf, messages)


def form_applies(ctx: RequestContext, form: dict) -> bool:
    """Whether an adapter's served ``form`` (``app.contract.policy.form_of``) differs
    from what the tenant's policy gives this request: only a ``json_schema`` request has a
    form (an adapter's dataset holds those alone), and only a field the form keeps counts."""
    rf = ctx.body.get("response_format")
    if not isinstance(rf, dict) or rf.get("type") != "json_schema":
        return False
    return bool(form_differs(form, ctx.policy))


def trained_form(ctx: RequestContext, form: dict, tier=None
                 ) -> tuple[dict, MinifyState | None]:
    """(body, state) for a request served by an adapter that learned ``form``: S02's work
    done under the tenant's policy with the form's fields in place of the policy's, on
    ``tier`` (the request's by default; a pool). The client's body (what S02 starts from)
    and None when the form minifies nothing. CPU work: call it in a worker thread."""
    policy = {**dict(ctx.policy), **form}
    source = _source(ctx)
    if policy.get("minify_enabled"):
        got = minify_request(source, policy, tokenizer_name(ctx, tier), pool=True)
        if got is not None:
            return got
    return source, None


def _compact(policy, body: dict, schema: dict) -> bool:
    """Swap ``response_format`` for a compact-separator grammar of the same schema (the
    body goes to a pool) when the policy wants it; False (body untouched) otherwise."""
    from app.core.minify_compact import compact_grammar, with_style_hint
    if not policy["minify_compact_json"] or "structured_outputs" in body:
        return False
    grammar = compact_grammar(schema)
    if grammar is None:
        return False
    body.pop("response_format", None)
    body["structured_outputs"] = {"grammar": grammar}
    if policy["minify_style_hint"]:
        body["messages"] = with_style_hint(body["messages"])
    return True


async def run(ctx: RequestContext) -> str:
    if ctx.body.get("tools") and ctx.policy.get("tool_retrieval"):
        from app.gateway import tool_retrieval
        ctx.tools_body = await anyio.to_thread.run_sync(tool_retrieval.choose, ctx)
    if not _wants(ctx):
        return await passthrough(ctx)
    state = await anyio.to_thread.run_sync(_minify, ctx, tokenizer_name(ctx))
    if state is None:
        return await passthrough(ctx)
    ctx.minify = state
    ctx.key_map = state.keymap
    km = state.keymap
    ctx.telemetry["minify"] = {
        "tokenizer": state.tokenizer, "alias_style": state.alias_style,
        "aliases": {o if p in ("", "$") else f"{p}.{o}": a
                    for p, o, a in (km.renames if km else ())[:50]},
        "value_aliases": {f"{p}={v}": a for p, v, a in (km.value_renames if km else ())[:50]},
        "tools": sorted(state.tool_maps), "compact": state.compact}
    await _count_tools(ctx)
    return "S03_PREFILL"


async def passthrough(ctx: RequestContext) -> str:
    ctx.upstream_body = _source(ctx)
    ctx.key_map = None
    ctx.minify = None
    await _count_tools(ctx)
    return "S03_PREFILL"


async def _count_tools(ctx: RequestContext) -> None:
    """Tool-definition tokens for the ledger (reporting: never fails the request)."""
    if not ctx.body.get("tools"):
        return
    from app.gateway import tool_retrieval
    try:
        await anyio.to_thread.run_sync(tool_retrieval.count_definitions, ctx)
    except Exception:  # noqa: BLE001
        import logging
        logging.getLogger(__name__).exception("request %s: tool tokens not counted",
                                              ctx.request_id)
