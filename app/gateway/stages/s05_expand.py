"""S05_KEY_EXPAND: map S02's minified keys back to the client's in the answer.

Non-streaming: validate the content against the minified schema, expand it (and tool
call arguments); on a schema error count S98 and, per the policy's
``schema_error_action``, retry once with the original body ("retry": back to
S04_DECODE) or serve the expanded text with a best-effort marker ("mark", field
``sluice_schema_error``). Streaming: install a ``StreamExpansion`` that the relay runs on
every chunk (one ``StreamExpander`` per choice and per tool call); a stream cannot be
retried, so it is marked in its final chunk. Fallback S98_ALERT_SCHEMA_ERR serves the
answer unexpanded rather than lose it.
"""
from __future__ import annotations

import logging

import anyio
import orjson

from app.gateway.context import RequestContext

log = logging.getLogger(__name__)
MARKER_FIELD = "sluice_schema_error"


def _alert(ctx: RequestContext, problems: list[str]) -> dict:
    from app.core.minify import best_effort_marker
    log.warning("request %s: %s: %s", ctx.request_id, "S98_ALERT_SCHEMA_ERR", problems[:3])
    ctx.telemetry["schema_error"] = True
    ctx.telemetry["schema_problems"] = problems[:10]
    if "S98_ALERT_SCHEMA_ERR" not in ctx.trace:
        ctx.trace.append("S98_ALERT_SCHEMA_ERR")
    if ctx.services is not None:
        ctx.services.metrics.schema_errors.inc()
    return best_effort_marker(problems)


def _savings(ctx: RequestContext, minified: str, expanded: str) -> None:
    from app.contract.savings import output_token_savings
    st = ctx.minify
    if st is None or st.keymap is None or not minified:
        return
    generated = (ctx.usage or {}).get("completion_tokens")
    try:
        if st.compact:
            # Count the keys' saving alone, both texts spaced as the engine writes without
            # Sluice: a constrained model writes '":' '"' as two tokens where canonical
            # tokenization has one, so crediting the separators would overstate the saving
            # (bench/results/minify_quality.txt: canonical -10%, generated -2%).
            from app.core.minify_compact import respace
            minified, expanded = respace(minified), respace(expanded)
        ctx.telemetry.setdefault("minify", {}).update(output_token_savings(
            minified, expanded, st.tokenizer,
            generated_tokens=int(generated) if generated is not None else None))
    except Exception:  # noqa: BLE001 - savings are reporting, never the answer
        log.exception("request %s: minify savings failed", ctx.request_id)


def expand_choices(st, data: dict) -> tuple[list[str], str, str]:
    """Expand every choice of a completion in place with S02's state ``st``; returns
    (problems, minified text, expanded text) of the response_format content (choice 0).
    The off-path probes expand their answers with it too (``app.gateway.shadow``)."""
    from app.core.minify import expand_text, expand_tool_arguments, validate_minified
    problems: list[str] = []
    raw = out = ""
    for ch in data.get("choices") or []:
        msg = ch.get("message") or {}
        content = msg.get("content")
        if st.keymap is not None and isinstance(content, str) and content:
            errs = validate_minified(content, st.schema)
            text, probs = expand_text(content, st.keymap)
            msg["content"] = text
            problems += errs + probs
            if ch.get("index", 0) == 0:
                raw, out = content, text
        for tc in msg.get("tool_calls") or []:
            fn = tc.get("function") or {}
            km = st.tool_maps.get(fn.get("name"))
            if km is not None and isinstance(fn.get("arguments"), str):
                fn["arguments"] = expand_tool_arguments(fn["arguments"], km)
    return problems, raw, out


def _expand_response(ctx: RequestContext) -> list[str]:
    data = orjson.loads(ctx.response_bytes)
    ctx.usage = data.get("usage") or {}
    problems, raw, out = expand_choices(ctx.minify, data)
    _savings(ctx, raw, out)
    ctx.response_json = data
    return problems


def _unsent_tool_called(ctx: RequestContext) -> bool:
    """A complete answer that calls a tool retrieval did not send, or a stub with arguments
    its full schema rejects (see tool_retrieval)."""
    info = ctx.telemetry.get("tools") or {}
    if ctx.stream or not (info.get("dropped") or info.get("stubbed")) \
            or not ctx.response_bytes:
        return False
    from app.gateway import tool_retrieval
    try:
        data = orjson.loads(ctx.response_bytes)
    except orjson.JSONDecodeError:
        return False
    return isinstance(data, dict) and tool_retrieval.needs_full_set(ctx, data)


async def run(ctx: RequestContext) -> str:
    if _unsent_tool_called(ctx):
        from app.gateway import tool_retrieval
        ctx.usage = (orjson.loads(ctx.response_bytes).get("usage") or {})
        ctx.record_attempt("tool_retry")
        ctx.upstream_body = ctx.tools_body = tool_retrieval.full_set_body(ctx)
        ctx.minify = ctx.key_map = None
        await anyio.to_thread.run_sync(tool_retrieval.count_definitions, ctx)
        return "S04_DECODE"
    if ctx.minify is None:
        return "RESPOND"
    if ctx.stream:
        ctx.stream_hooks.append(StreamExpansion(ctx))
        return "RESPOND"
    problems = await anyio.to_thread.run_sync(_expand_response, ctx)
    if problems:
        marker = _alert(ctx, problems)
        ctx.telemetry["schema_valid"] = False
        if ctx.policy["schema_error_action"] == "retry" \
                and not ctx.telemetry.get("schema_retry"):
            ctx.telemetry["schema_retry"] = True
            ctx.record_attempt("schema_retry")
            ctx.upstream_body = ctx.minify.original_body
            ctx.minify = ctx.key_map = None
            return "S04_DECODE"
        ctx.response_json[MARKER_FIELD] = marker
    elif ctx.minify.keymap is not None:
        ctx.telemetry["schema_valid"] = True
    ctx.response_bytes = orjson.dumps(ctx.response_json)
    return "RESPOND"


class _Choice:
    __slots__ = ("content", "raw", "out", "tools")

    def __init__(self, keymap) -> None:
        from app.core.minify import StreamExpander
        self.content = StreamExpander(keymap) if keymap is not None else None
        self.raw: list[str] = []
        self.out: list[str] = []
        self.tools: dict[int, object] = {}    # tool call index -> StreamExpander | None


class StreamExpansion:
    """A relay hook: expands each chunk's deltas as they pass; on a choice's finish
    chunk flushes what the expander held and validates the whole minified text."""

    def __init__(self, ctx: RequestContext) -> None:
        self.ctx = ctx
        self.st = ctx.minify
        self.choices: dict[int, _Choice] = {}

    def _choice(self, idx: int) -> _Choice:
        c = self.choices.get(idx)
        if c is None:
            c = self.choices[idx] = _Choice(self.st.keymap)
        return c

    def _tools(self, c: _Choice, delta: dict) -> None:
        from app.core.minify import StreamExpander
        for tc in delta.get("tool_calls") or []:
            i = int(tc.get("index", 0))
            fn = tc.get("function") or {}
            if i not in c.tools:
                km = self.st.tool_maps.get(fn.get("name"))
                c.tools[i] = StreamExpander(km) if km is not None else None
            ex = c.tools[i]
            if ex is not None and fn.get("arguments"):
                fn["arguments"] = ex.feed(fn["arguments"])

    def _finish(self, c: _Choice, delta: dict) -> list[str]:
        from app.core.minify import validate_minified
        problems: list[str] = []
        if c.content is not None:
            tail = c.content.close()
            if tail:
                delta["content"] = (delta.get("content") or "") + tail
                c.out.append(tail)
            problems += c.content.problems
            raw = "".join(c.raw)
            problems += validate_minified(raw, self.st.schema) if raw else ["empty output"]
        tails = []
        for i, ex in c.tools.items():
            if ex is not None:
                tail = ex.close()
                if tail:
                    tails.append({"index": i, "function": {"arguments": tail}})
        if tails:
            delta["tool_calls"] = (delta.get("tool_calls") or []) + tails
        return problems

    def chunk(self, data: dict) -> dict | None:
        problems: list[str] = []
        keep = bool(data.get("usage")) or not data.get("choices")
        for ch in data.get("choices") or []:
            c = self._choice(int(ch.get("index", 0)))
            delta = ch.get("delta") or {}
            text = delta.get("content")
            if c.content is not None and text:
                c.raw.append(text)
                out = c.content.feed(text)
                c.out.append(out)
                delta["content"] = out
            self._tools(c, delta)
            if ch.get("finish_reason"):
                problems += self._finish(c, delta)
            if delta.get("content") or delta.get("tool_calls") or delta.get("role") \
                    or ch.get("finish_reason") or ch.get("logprobs"):
                keep = True
        if problems:
            data[MARKER_FIELD] = _alert(self.ctx, problems)
            self.ctx.telemetry["schema_valid"] = False
        return data if keep else None

    def done(self) -> None:
        """Stream over: record what minification saved (choice 0)."""
        c = self.choices.get(0)
        if c is None or c.content is None:
            return
        if not self.ctx.telemetry.get("schema_error"):
            self.ctx.telemetry["schema_valid"] = True
        _savings(self.ctx, "".join(c.raw), "".join(c.out))


async def alert_schema_error(ctx: RequestContext) -> str:
    log.error("request %s: schema key expansion failed: %s", ctx.request_id,
              ctx.stage_errors[-1] if ctx.stage_errors else "")
    ctx.telemetry["schema_error"] = True
    ctx.telemetry["schema_valid"] = False
    if ctx.services is not None:
        ctx.services.metrics.schema_errors.inc()
    return "RESPOND"
