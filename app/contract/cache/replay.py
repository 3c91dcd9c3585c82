"""Serving a cached (assembled) response as an OpenAI chat.completion.chunk stream."""
from __future__ import annotations

import json
import re
import time
from typing import Iterable, Iterator

_PIECE = re.compile(r"\S+\s*|\s+")


def _pieces(text: str, words_per_chunk: int) -> list[str]:
    words = _PIECE.findall(text)
    return ["".join(words[i:i + words_per_chunk]) for i in range(0, len(words), words_per_chunk)]


def replay_as_sse_chunks(cached_response: dict, model: str, request_id: str,
                         words_per_chunk: int = 4) -> list[dict]:
    """Chunk dicts in OpenAI order: role, content pieces, tool calls, finish_reason, usage.

    ``request_id`` becomes the chunk id (``chatcmpl-<request_id>``) so the client sees the
    id of the request it made, not the one whose answer is reused.
    """
    cid = request_id if str(request_id).startswith("chatcmpl-") else f"chatcmpl-{request_id}"
    created = int(time.time())

    def chunk(index: int, delta: dict, finish: str | None = None) -> dict:
        return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": index, "delta": delta, "logprobs": None,
                             "finish_reason": finish}]}

    out: list[dict] = []
    for choice in cached_response.get("choices") or []:
        idx = int(choice.get("index", 0))
        msg = choice.get("message") or {}
        out.append(chunk(idx, {"role": msg.get("role") or "assistant", "content": ""}))
        for piece in _pieces(msg.get("content") or "", max(1, words_per_chunk)):
            out.append(chunk(idx, {"content": piece}))
        for i, call in enumerate(msg.get("tool_calls") or []):
            out.append(chunk(idx, {"tool_calls": [{"index": i, **call}]}))
        out.append(chunk(idx, {}, choice.get("finish_reason") or "stop"))
    usage = cached_response.get("usage")
    if usage is not None:
        out.append({"id": cid, "object": "chat.completion.chunk", "created": created,
                    "model": model, "choices": [], "usage": usage})
    return out


def sse_lines(chunks: Iterable[dict]) -> Iterator[bytes]:
    """``data: {...}`` events followed by ``data: [DONE]``."""
    for c in chunks:
        yield b"data: " + json.dumps(c, separators=(",", ":")).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


def assemble_stream(chunks: Iterable[dict]) -> dict:
    """The chat.completion a streamed answer amounts to, for storing after a streamed miss."""
    choices: dict[int, dict] = {}
    base: dict = {}
    usage = None
    for c in chunks:
        base = base or {k: c.get(k) for k in ("id", "created", "model")}
        usage = c.get("usage") or usage
        for ch in c.get("choices") or []:
            slot = choices.setdefault(int(ch.get("index", 0)), {
                "index": int(ch.get("index", 0)), "finish_reason": None,
                "message": {"role": "assistant", "content": ""}})
            delta = ch.get("delta") or {}
            if delta.get("role"):
                slot["message"]["role"] = delta["role"]
            if delta.get("content"):
                slot["message"]["content"] += delta["content"]
            for tc in delta.get("tool_calls") or []:
                calls = slot["message"].setdefault("tool_calls", [])
                i = int(tc.get("index", len(calls)))
                while len(calls) <= i:
                    calls.append({"id": "", "type": "function",
                                  "function": {"name": "", "arguments": ""}})
                call = calls[i]
                call["id"] = tc.get("id") or call["id"]
                fn = tc.get("function") or {}
                call["function"]["name"] += fn.get("name") or ""
                call["function"]["arguments"] += fn.get("arguments") or ""
            if ch.get("finish_reason"):
                slot["finish_reason"] = ch["finish_reason"]
    resp = {**base, "object": "chat.completion",
            "choices": [choices[i] for i in sorted(choices)]}
    if usage is not None:
        resp["usage"] = usage
    return resp
