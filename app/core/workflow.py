"""Workflow (the seed's task signature) of a chat request. Pure.

A workflow is named by the client's ``X-Sluice-Workflow`` header when present; else it is
sha256(tenant + the static part of the system prompt + the response schema), where the
static part drops what changes per call (dates, times, UUIDs, long numbers and hex ids),
so one prompt template with a timestamp in it stays one workflow.
"""
from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from typing import Any, Iterable, Mapping

import orjson

_DYNAMIC = [
    re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I),
    re.compile(r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?"
               r"(?:Z|[+-]\d{2}:?\d{2})?)?\b"),
    re.compile(r"\b\d{1,2}:\d{2}(?::\d{2})?\b"),
    re.compile(r"\b[0-9a-f]{12,}\b", re.I),
    re.compile(r"\b\d{5,}\b"),
]
_HEADER_OK = re.compile(r"^[A-Za-z0-9._:/-]{1,64}$")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "\n".join(p.get("text", "") for p in content
                         if isinstance(p, Mapping) and p.get("type") == "text")
    return ""


def static_system_prompt(messages: Iterable[Mapping[str, Any]]) -> str:
    """The leading system/developer messages with per-call values masked."""
    parts = []
    for m in messages:
        if m.get("role") not in ("system", "developer"):
            break
        parts.append(_text(m.get("content")))
    return _masked("\n".join(parts))


@lru_cache(maxsize=1024)
def _masked(text: str) -> str:
    """``text`` with per-call values masked and white space folded. Kept per text: a
    workflow's system prompt comes back on every call, and five regex passes over a long
    prompt were a visible share of the gateway's CPU per request."""
    for rx in _DYNAMIC:
        text = rx.sub("\x00", text)
    return " ".join(text.split())


def response_schema(body: Mapping[str, Any]) -> Any:
    """What shapes the answer: response_format's JSON schema, and the tools' parameters."""
    fmt = body.get("response_format")
    schema = None
    if isinstance(fmt, Mapping):
        schema = fmt.get("json_schema", {"type": fmt.get("type")})
    tools = body.get("tools")
    tool_schemas = None
    if isinstance(tools, list):
        tool_schemas = [t.get("function", t) for t in tools if isinstance(t, Mapping)]
    return {"format": schema, "tools": tool_schemas}


def workflow_signature(tenant_id: int, body: Mapping[str, Any],
                       header: str | None = None) -> tuple[str, str]:
    """Return (signature, suggested name). Signatures fit the 64-char columns."""
    if header:
        header = header.strip()
    if header:
        name = header[:200]
        if _HEADER_OK.match(header):
            return header, name
        return "h:" + hashlib.sha256(header.encode()).hexdigest()[:62], name
    material = orjson.dumps(
        [tenant_id, static_system_prompt(body.get("messages") or []), response_schema(body)],
        option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(material).hexdigest(), ""
