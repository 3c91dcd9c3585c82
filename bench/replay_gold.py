"""The frontier tier of bench/replay.py: a real HTTP server speaking OpenAI's chat API that
answers from the month's gold set, as a strong paid model would.

    python bench/replay_gold.py <gold.json> <port-file>

It finds the request's gold entry by its last user message (and, where several entries
share that text, by the context that tells them apart: the contract a question is about,
the earlier turn of a conversation). A JSON answer follows the schema it was sent: the
gold object's keys are written under that schema's property names, in order, so a
minified schema (S02's one-token aliases) gets the aliases, as a model following it would.
Usage counts tokens with o200k_base; no provider-side prompt caching is reported.

Latency model (stated; a real frontier API is not instant): first token after 0.25 s +
0.02 ms per prompt token, the rest streamed at 150 tokens/s in three chunks.
"""
from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
import uuid
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TTFT_S, PER_PROMPT_TOKEN_S, TOKENS_PER_S = 0.25, 0.00002, 150.0


def _text(content) -> str:
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def index(entries: list[dict]) -> dict[str, list[dict]]:
    by_user: dict[str, list[dict]] = {}
    for e in entries:
        by_user.setdefault(e["user"].strip(), []).append(e)
    return by_user


def lookup(by_user: dict[str, list[dict]], messages: list[dict]) -> dict | None:
    users = [_text(m.get("content")) for m in messages if m.get("role") == "user"]
    if not users:
        return None
    found = by_user.get(users[-1].strip()) or []
    if len(found) <= 1:
        return found[0] if found else None
    context = "\n".join(_text(m.get("content")) for m in messages[:-1])
    for e in found:
        if e["context"] and e["context"] in context:
            return e
    return found[0]


def shaped(gold, response_format: dict | None):
    """Gold object keys written under the sent schema's property names, in order."""
    if not isinstance(gold, dict):
        return str(gold)
    props = (((response_format or {}).get("json_schema") or {}).get("schema") or {}) \
        .get("properties")
    if isinstance(props, dict) and len(props) == len(gold):
        gold = dict(zip(props, gold.values()))
    return json.dumps(gold, separators=(",", ":"))


def create_app(gold_path: str):
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route
    from app.contract.tokenizers import count_tokens

    by_user = index(json.loads(Path(gold_path).read_text()))
    stats = {"requests": 0, "unknown": 0}

    async def chat(request: Request) -> Response:
        body = orjson.loads(await request.body())
        stats["requests"] += 1
        messages = body.get("messages") or []
        entry = lookup(by_user, messages)
        if entry is None:
            stats["unknown"] += 1
            content = "I cannot answer that."
        else:
            content = shaped(entry["gold"], body.get("response_format"))
        prompt = sum(count_tokens(_text(m.get("content")), "o200k_base") + 4 for m in messages)
        out = count_tokens(content, "o200k_base")
        usage = {"prompt_tokens": prompt, "completion_tokens": out,
                 "total_tokens": prompt + out, "prompt_tokens_details": {"cached_tokens": 0}}
        rid, model, created = f"chatcmpl-{uuid.uuid4().hex[:20]}", body.get("model", ""), int(time.time())
        await asyncio.sleep(TTFT_S + PER_PROMPT_TOKEN_S * prompt)
        if not body.get("stream"):
            await asyncio.sleep(out / TOKENS_PER_S)
            return JSONResponse({"id": rid, "object": "chat.completion", "created": created,
                                 "model": model, "usage": usage, "choices": [{
                                     "index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": content}}]})

        async def events():
            def chunk(delta: dict, finish=None, with_usage=None) -> bytes:
                ev = {"id": rid, "object": "chat.completion.chunk", "created": created,
                      "model": model, "choices": [{"index": 0, "delta": delta,
                                                   "finish_reason": finish}]}
                if with_usage is not None:
                    ev = {**ev, "choices": [], "usage": with_usage}
                return b"data: " + orjson.dumps(ev) + b"\n\n"
            yield chunk({"role": "assistant", "content": ""})
            step = max(1, len(content) // 3)
            for i in range(0, len(content), step):
                yield chunk({"content": content[i:i + step]})
                await asyncio.sleep(out / TOKENS_PER_S / 3)
            yield chunk({}, "stop")
            if (body.get("stream_options") or {}).get("include_usage"):
                yield chunk({}, with_usage=usage)
            yield b"data: [DONE]\n\n"
        return StreamingResponse(events(), media_type="text/event-stream")

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "frontier-model",
                                                          "object": "model"}]})

    async def get_stats(request: Request) -> Response:
        return JSONResponse(stats)

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                             Route("/v1/models", models), Route("/stats", get_stats)])


def main() -> None:
    import uvicorn
    gold, port_file = sys.argv[1], sys.argv[2]
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    Path(port_file).write_text(str(sock.getsockname()[1]))
    uvicorn.Server(uvicorn.Config(create_app(gold), log_level="warning",
                                  access_log=False)).run(sockets=[sock])


if __name__ == "__main__":
    main()
