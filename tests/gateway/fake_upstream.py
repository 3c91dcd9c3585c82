"""A small OpenAI-compatible chat server for gateway tests: deterministic content,
streaming with usage, logprobs, and directives in the last user message:

``[[status:503]]`` answer that status; ``[[delay:200]]`` wait ms before answering;
``[[chunk-delay:50]]`` wait ms between stream chunks; ``[[drop-after:2]]`` send two
content chunks then cut the connection; ``[[garbage:N]]`` stream a malformed event stream
(seeded by N: invalid UTF-8, broken JSON, odd framing, a chunk without choices...);
``[[json:1]]`` (not streamed) answer JSON under the schema sent (``schema_answer``);
``[[json:2]]`` the same with the values taken from the words of the last user message, in
order (an extraction a small model can learn);
``[[call-tool:NAME]]`` in any message (streamed too: the call in deltas) answer with a call to tool NAME, sent
or not, as a frontier model that saw the tool earlier in the conversation might, with
arguments ``{}`` (``[[call-tool:NAME {"city": "Oslo"}]]``: those arguments).

A fake named ``unsure...`` is a low-confidence model: its answers start ``Unsure:`` and
its logprobs have a small top-1/top-2 gap (margin 0.3; the normal fake's is 2.95). A fake
named ``novice...`` is a small model out of its depth on long prompts: unsure as above
when the last user message has more than NOVICE_WORDS words, confident otherwise.

Content does not depend on the replica (the ``x-fake-replica`` header says which one
answered). ``cached_tokens`` = the system prompt's words when this replica saw that
system prompt before under the same ``cache_salt`` (an engine prefix cache stand-in). ``GET /stats`` counts requests,
and streams that ran to the end (``streams_finished``) or were closed by the caller before
it (``streams_cancelled``, with ``last_cancelled_after`` content chunks sent), as an
engine that aborts a request whose client went away.
"""
from __future__ import annotations

import asyncio
import re
import time

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

_DIRECTIVE = re.compile(r"\[\[([a-z-]+):(\d+)\]\]")
_CALL_TOOL = re.compile(r"\[\[call-tool:([A-Za-z0-9_.-]+)(?: (\{.*?\}))?\]\]")
NOVICE_WORDS = 24
CONFIDENT, UNSURE = ("Echo", -0.05, -3.0), ("Unsure", -0.6, -0.9)


def _text(content) -> str:
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def answer_words(messages: list[dict], prefix: str = "Echo") -> list[str]:
    last = next((_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")
    words = _DIRECTIVE.sub("", last).split()[:12]
    return [prefix + ":"] + words if words else [prefix + "."]


def schema_answer(body: dict, words: list[str] | None = None) -> str | None:
    """``[[json:1]]``: a JSON answer under the ``response_format`` schema sent (its property
    names, in order, valued by position: numbers 1, 2..., booleans true, strings "v0"...),
    as a model following whatever keys it was given; None without a json_schema.
    ``words`` (``[[json:2]]``): property i takes word i instead (a number when its type is
    a number and the word is one)."""
    rf = body.get("response_format") or {}
    props = ((rf.get("json_schema") or {}).get("schema") or {}).get("properties")
    if rf.get("type") != "json_schema" or not isinstance(props, dict):
        return None
    typed = {"number": lambda i: i + 1, "integer": lambda i: i + 1, "boolean": lambda i: True}

    def value(i: int, spec: dict):
        kind = (spec or {}).get("type")
        if words is None:
            return typed.get(kind, lambda i: f"v{i}")(i)
        word = words[i] if i < len(words) else ""
        return int(word) if kind in ("integer", "number") and word.isdigit() else word
    return orjson.dumps({k: value(i, v) for i, (k, v) in enumerate(props.items())}).decode()


def create_fake(name: str = "fake") -> Starlette:
    unsure, novice = name.startswith("unsure"), name.startswith("novice")
    seen_prefixes: set[str] = set()
    stats = {"requests": 0, "last_headers": {}, "last_body": None, "streams_finished": 0,
             "streams_cancelled": 0, "last_cancelled_after": None}

    async def chat(request: Request) -> Response:
        body = orjson.loads(await request.body())
        stats["requests"] += 1
        stats["last_headers"] = dict(request.headers)
        stats["last_body"] = body
        messages = body.get("messages") or []
        last = _text(next((m.get("content") for m in reversed(messages)
                           if m.get("role") == "user"), ""))
        ctl = {k: int(v) for k, v in _DIRECTIVE.findall(last)}
        hard = unsure or (novice and len(_DIRECTIVE.sub("", last).split()) > NOVICE_WORDS)
        prefix, top1, top2 = UNSURE if hard else CONFIDENT
        if ctl.get("delay"):
            await asyncio.sleep(ctl["delay"] / 1000)
        if ctl.get("status"):
            return Response(orjson.dumps({"error": {"message": f"fake {ctl['status']}",
                                                    "type": "server_error", "param": None,
                                                    "code": None}}),
                            status_code=ctl["status"], media_type="application/json")
        system = " ".join(_text(m.get("content")) for m in messages if m.get("role") == "system")
        prompt_tokens = sum(len(_text(m.get("content")).split()) for m in messages)
        # like vLLM, a request's cache_salt keeps its prefix blocks apart from other salts'
        cache_key = (body.get("cache_salt") or "", system)
        cached = len(system.split()) if system and cache_key in seen_prefixes else 0
        if system:
            seen_prefixes.add(cache_key)
        words = answer_words(messages, prefix)
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or 1000
        words = words[:max_tokens]
        finish = "stop" if len(answer_words(messages, prefix)) <= max_tokens else "length"
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(words),
                 "total_tokens": prompt_tokens + len(words),
                 "prompt_tokens_details": {"cached_tokens": cached}}
        cid, created, model = f"chatcmpl-{stats['requests']}", int(time.time()), body.get("model")
        headers = {"x-fake-replica": name}
        want_lp = bool(body.get("logprobs"))
        top_n = int(body.get("top_logprobs") or 0)

        def lp(tok: str) -> dict:
            return {"content": [{"token": tok, "logprob": top1, "bytes": list(tok.encode()),
                                 "top_logprobs": [{"token": tok, "logprob": top1,
                                                   "bytes": list(tok.encode())},
                                                  {"token": "x", "logprob": top2,
                                                   "bytes": [120]}][:top_n]}]}

        called = _CALL_TOOL.search(" ".join(_text(m.get("content")) for m in messages))
        if called and not body.get("stream"):
            sent = sorted(t["function"]["name"] for t in body.get("tools") or [])
            stats["last_tools"] = sent
            return Response(orjson.dumps({
                "id": cid, "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "message": {
                    "role": "assistant", "content": None, "tool_calls": [{
                        "id": f"call_{stats['requests']}", "type": "function",
                        "function": {"name": called.group(1),
                                     "arguments": called.group(2) or "{}"}}]},
                    "logprobs": None, "finish_reason": "tool_calls"}],
                "usage": usage}), media_type="application/json", headers=headers)
        if not body.get("stream"):
            content = schema_answer(body, _DIRECTIVE.sub("", last).split()
                                    if ctl.get("json") == 2 else None) \
                if ctl.get("json") else None
            content = content if content is not None else " ".join(words)
            return Response(orjson.dumps({
                "id": cid, "object": "chat.completion", "created": created, "model": model,
                "system_fingerprint": "fp_fake",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                             "logprobs": lp(content) if want_lp else None,
                             "finish_reason": finish}],
                "usage": usage}), media_type="application/json", headers=headers)

        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk(delta: dict, finish_reason=None, logprobs=None, **extra) -> bytes:
            obj = {"id": cid, "object": "chat.completion.chunk", "created": created,
                   "model": model, "system_fingerprint": "fp_fake",
                   "choices": [{"index": 0, "delta": delta, "logprobs": logprobs,
                                "finish_reason": finish_reason}], **extra}
            if include_usage:
                obj.setdefault("usage", None)
            return b"data: " + orjson.dumps(obj) + b"\n\n"

        async def garbage(seed: int):
            import random
            rng = random.Random(seed)
            pieces = [b"data: {not json}\n\n", b"data: \xff\xfe\xfd\n\n", b"data:\n\n",
                      b": comment\n\n", b"event: weird\ndata: {}\n\n", b"data: []\n\n",
                      b"data: {\"choices\": 7}\n\n", b"data: {\"choices\": [{}]}\n\n",
                      b"data: {\"choices\": [{\"delta\": {\"content\": 5}}]}\n\n",
                      b"data: " + b"[" * 5000 + b"\n\n", b"\r\n\r\n", b"data: null\n\n",
                      b"data: {\"usage\": {\"completion_tokens\": -3}}\n\n",
                      b"data: {\"usage\": \"lots\"}\n\n", bytes(rng.randrange(256)
                                                                 for _ in range(64))]
            yield chunk({"role": "assistant", "content": ""})
            for _ in range(rng.randrange(1, 12)):
                yield rng.choice(pieces)
            if rng.random() < 0.5:
                yield b"data: [DONE]\n\n"

        if ctl.get("garbage") and body.get("stream"):
            return StreamingResponse(garbage(ctl["garbage"]), media_type="text/event-stream",
                                     headers=headers)

        async def tool_gen():
            name, args = called.group(1), called.group(2) or "{}"
            stats["last_tools"] = sorted(t["function"]["name"] for t in body.get("tools") or [])
            yield chunk({"role": "assistant", "content": None})
            yield chunk({"tool_calls": [{"index": 0, "id": f"call_{stats['requests']}",
                                         "type": "function",
                                         "function": {"name": name, "arguments": ""}}]})
            half = len(args) // 2
            for piece in (args[:half], args[half:]):
                yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
            yield chunk({}, finish_reason="tool_calls")
            if include_usage:
                yield b"data: " + orjson.dumps({"id": cid, "object": "chat.completion.chunk",
                                                "created": created, "model": model,
                                                "choices": [], "usage": usage}) + b"\n\n"
            yield b"data: [DONE]\n\n"
            stats["streams_finished"] += 1

        if called:
            return StreamingResponse(tool_gen(), media_type="text/event-stream", headers=headers)

        async def gen():
            sent, done = 0, False
            try:
                yield chunk({"role": "assistant", "content": ""})
                for i, w in enumerate(words):
                    if ctl.get("chunk-delay"):
                        await asyncio.sleep(ctl["chunk-delay"] / 1000)
                    if "drop-after" in ctl and i >= ctl["drop-after"]:
                        done = True  # our own cut, not the caller's
                        raise ConnectionAbortedError("fake upstream cut the stream")
                    tok = w if i == 0 else " " + w
                    yield chunk({"content": tok}, logprobs=lp(tok) if want_lp else None)
                    sent += 1
                yield chunk({}, finish_reason=finish)
                if include_usage:
                    yield b"data: " + orjson.dumps({"id": cid, "object": "chat.completion.chunk",
                                                    "created": created, "model": model,
                                                    "choices": [], "usage": usage}) + b"\n\n"
                yield b"data: [DONE]\n\n"
                done = True
                stats["streams_finished"] += 1
            finally:
                if not done:
                    stats["streams_cancelled"] += 1
                    stats["last_cancelled_after"] = sent

        return StreamingResponse(gen(), media_type="text/event-stream", headers=headers)

    async def stats_view(request: Request) -> Response:
        return Response(orjson.dumps(stats), media_type="application/json")

    async def health(request: Request) -> Response:
        return Response(b"ok")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                             Route("/stats", stats_view), Route("/health", health)])
