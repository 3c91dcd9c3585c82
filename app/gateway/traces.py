"""Trace capture for the LoRA flywheel: the gateway's side.

After the client has its answer, a successful request of a workflow that the frontier
tier (the highest rank) served is appended to ``Keys.trace_stream()`` (field ``e``: the
JSON of a ``TraceEvent``), scrubbed first. The stream is capped (``XADD MAXLEN ~``,
``ADAPTER_TRACE_MAXLEN``) and sampled (``ADAPTER_TRACE_SAMPLE``); a Redis error drops
the trace, never the answer. The ``adapters.drain_traces`` task moves the stream into
``adapter_traces`` (``app.adapters.traces``).

A streamed answer is captured from what the relay assembled (``ctx.collected``): S04 asks
the relay to assemble every frontier stream of a workflow (``candidate``).
"""
from __future__ import annotations

import logging
import random
import re
from datetime import datetime, timezone
from typing import Any, TypedDict

import anyio
import orjson

from app.gateway.context import RequestContext

log = logging.getLogger(__name__)


class TraceEvent(TypedDict):
    request_id: str
    at: str                     # ISO 8601, UTC
    tenant_id: int
    workflow: str               # workflow signature
    tier: str
    messages: list[dict]        # the client's messages, scrubbed
    response_format: dict | None
    answer: str                 # the answer's text, scrubbed
    max_tokens: int | None      # the client's output budget (max_tokens / max_completion_tokens)


# --- the scrubber (pure; app.adapters.traces re-exports it) -----------------------------
_PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----",
                          re.S)
_SECRETS = re.compile(
    r"\b(?:sk-[A-Za-z0-9_-]{12,}"              # OpenAI-style and Sluice keys (sk-sl-...)
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}"              # AWS access key ids
    r"|gh[pousr]_[A-Za-z0-9]{20,}"             # GitHub tokens
    r"|xox[abprs]-[A-Za-z0-9-]{10,}"           # Slack tokens
    r"|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})")  # JWTs
_BEARER = re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/-]{12,}=*")
_LABELLED = re.compile(r"(?i)\b(api[_-]?key|secret|password|passwd|pwd|token)(\s*[:=]\s*)"
                       r"(?!\[)[\"']?[^\s\"',;]{4,}[\"']?")
_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
# Runs of digits with the separators phone and card numbers use; classified by _number.
_NUMBER = re.compile(r"(?<![\w+.-])\+?\(?\d[\d\s().-]{5,}\d(?![\w.-]?\d)(?!\w)")
_DATE_OR_IP = re.compile(r"\d{4}-\d{1,2}-\d{1,2}|\d{1,3}(?:\.\d{1,3}){3}")
_GAPS = re.compile(r"\d+")


def _number(m: re.Match) -> str:
    """Card-like (13-19 digits, no phone punctuation) -> [CARD]; phone-like (7-15
    digits with a +, parentheses or two separated groups) -> [PHONE]; else unchanged."""
    raw = m.group(0)
    core = raw.strip()
    if _DATE_OR_IP.fullmatch(core):
        return raw
    digits = sum(len(g) for g in _GAPS.findall(core))
    groups = len(_GAPS.findall(core))
    phoney = core.startswith("+") or "(" in core
    if 13 <= digits <= 19 and not phoney:
        return raw.replace(core, "[CARD]")
    if 7 <= digits <= 15 and (phoney or groups >= 3 or (groups == 2 and digits >= 10)):
        return raw.replace(core, "[PHONE]")
    return raw


def scrub(text: str) -> str:
    """``text`` with e-mail addresses, phone numbers, card-like digit runs and obvious
    secrets (API keys, bearer tokens, JWTs, private keys, ``password=...``) masked."""
    if not text:
        return text
    text = _PRIVATE_KEY.sub("[SECRET]", text)
    text = _SECRETS.sub("[SECRET]", text)
    text = _BEARER.sub(r"\1 [SECRET]", text)
    text = _LABELLED.sub(r"\1\2[SECRET]", text)
    text = _EMAIL.sub("[EMAIL]", text)
    return _NUMBER.sub(_number, text)


def scrub_messages(messages: list[Any]) -> list[dict]:
    """Chat messages with every text (string content or text parts) scrubbed."""
    out = []
    for m in messages or ():
        if not isinstance(m, dict):
            continue
        m = dict(m)
        content = m.get("content")
        if isinstance(content, str):
            m["content"] = scrub(content)
        elif isinstance(content, list):
            m["content"] = [{**p, "text": scrub(p["text"])}
                            if isinstance(p, dict) and isinstance(p.get("text"), str) else p
                            for p in content]
        out.append(m)
    return out


# --- capture ------------------------------------------------------------------------
def _answer(ctx: RequestContext) -> str | None:
    response = ctx.response_json if ctx.response_json is not None else ctx.collected
    try:
        content = response["choices"][0]["message"]["content"]
    except (TypeError, KeyError, IndexError):
        return None
    return content if isinstance(content, str) and content else None


def candidate(ctx: RequestContext) -> bool:
    """A request of a workflow on the frontier tier: its answer may become a trace."""
    tiers = ctx.snapshot.tiers
    return bool(ctx.tier and ctx.workflow_signature and tiers
                and ctx.tier.get("rank") == tiers[-1].rank)


def wanted(ctx: RequestContext) -> bool:
    """A successful answer of a workflow, generated by the frontier tier, sampled in."""
    if ctx.status != 200 or ctx.cache != "miss" or not candidate(ctx):
        return False
    sample = float(ctx.services.config["ADAPTER_TRACE_SAMPLE"])
    return (sample >= 1.0 or random.random() < sample) and _answer(ctx) is not None


def trace_event(ctx: RequestContext) -> TraceEvent:
    rf = ctx.body.get("response_format")
    return {"request_id": ctx.request_id, "at": datetime.now(timezone.utc).isoformat(),
            "tenant_id": int(ctx.tenant["id"]), "workflow": ctx.workflow_signature,
            "tier": ctx.tier.get("name", ""),
            "messages": scrub_messages(ctx.body.get("messages") or []),
            "response_format": rf if isinstance(rf, dict) else None,
            "answer": scrub(_answer(ctx) or ""),
            "max_tokens": output_budget(ctx.body)}


def output_budget(body: dict) -> int | None:
    """The request's own output cap, None when it set none (or set nonsense)."""
    for name in ("max_completion_tokens", "max_tokens"):
        v = body.get(name)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


async def capture(ctx: RequestContext) -> None:
    """Scrub (off the event loop) and append the trace; a failure is logged, not raised."""
    services = ctx.services
    try:
        data = await anyio.to_thread.run_sync(lambda: orjson.dumps(trace_event(ctx)))
        await services.redis.xadd(services.keys.trace_stream(), {"e": data},
                                  maxlen=int(services.config["ADAPTER_TRACE_MAXLEN"]),
                                  approximate=True)
    except Exception as exc:  # noqa: BLE001 - a lost trace never fails the answer
        log.warning("request %s: trace not captured: %s", ctx.request_id, exc)


def offer(ctx: RequestContext, spawn) -> None:
    """``Gateway.book``'s hook: when ``ctx`` is a trace, ``spawn`` its capture (it runs
    after the answer). Never raises."""
    try:
        if wanted(ctx):
            spawn(capture(ctx))
    except Exception:  # noqa: BLE001 - the flywheel never fails the answer
        log.exception("request %s: trace capture failed", ctx.request_id)
