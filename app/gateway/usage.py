"""Usage the gateway counts itself, for a stream that ended before the upstream's usage
chunk (the client hung up, the upstream broke off): the ledger books what was served, so
a client cannot get an answer for free by closing the connection before the last chunk.

Prompt tokens are counted with the tier's tokenizer over what was sent upstream (message
contents and tool definitions, plus a few tokens per message for the chat template);
completion tokens are the relayed deltas' text and tool-call arguments counted the same
way, and never fewer than the content chunks relayed (an engine sends at most one
chunk per generated token when it streams, so N chunks cost at least N tokens).
The ledger marks such a request ``usage_source: counted``.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from app.gateway.context import RequestContext
from app.gateway.request_facts import tokenizer_name

PER_MESSAGE_TOKENS = 4   # role and separators of a chat template, per message


def _text(content: Any) -> str:
    if isinstance(content, list):
        return " ".join(p.get("text") or "" for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def prompt_text(body: Mapping[str, Any]) -> tuple[str, int]:
    """(the text a prompt's tokens come from, its number of messages)."""
    messages = body.get("messages") or []
    parts = [_text(m.get("content")) for m in messages if isinstance(m, dict)]
    if body.get("tools"):
        parts.append(orjson.dumps(body["tools"]).decode())
    return "\n".join(parts), len(messages)


def relayed_text(events: Iterable[dict]) -> tuple[str, int]:
    """(the text the relayed chunks carried, how many carried any)."""
    parts: list[str] = []
    carrying = 0
    for ev in events:
        n = len(parts)
        for choice in ev.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content"):
                parts.append(delta["content"])
            for call in delta.get("tool_calls") or ():
                fn = call.get("function") or {}
                parts += [fn.get("name") or "", fn.get("arguments") or ""]
        carrying += len(parts) > n
    return "".join(parts), carrying


def counted_usage(ctx: RequestContext, events: Iterable[dict]) -> dict[str, Any]:
    """An OpenAI usage object for what ``ctx`` sent upstream and the relayed ``events``."""
    from app.contract.tokenizers import get_counter
    counter = get_counter(tokenizer_name(ctx))
    text, n_messages = prompt_text(ctx.upstream_body or ctx.body)
    prompt = counter.count(text) + PER_MESSAGE_TOKENS * n_messages
    out_text, carrying = relayed_text(events)
    completion = max(counter.count(out_text), carrying)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": 0}}
