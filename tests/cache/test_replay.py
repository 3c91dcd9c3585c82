"""A cached answer replayed as an OpenAI chunk stream assembles back to the same answer."""
import json

from app.contract.cache.replay import assemble_stream, replay_as_sse_chunks, sse_lines

CACHED = {"id": "chatcmpl-old", "object": "chat.completion", "model": "tier-1", "choices": [
    {"index": 0, "finish_reason": "stop",
     "message": {"role": "assistant", "content": "The warranty for SKU-1071 in Florida is 2 years."}}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 11, "total_tokens": 23}}


def test_chunks_follow_the_openai_shape():
    chunks = replay_as_sse_chunks(CACHED, "auto", "req-new")
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == "chatcmpl-req-new"
               and c["model"] == "auto" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-2]] == [None] * (len(chunks) - 2)
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 23
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == CACHED["choices"][0]["message"]["content"]
    assert len(chunks) > 4  # really streamed in pieces


def test_round_trip_through_assembly_and_sse_framing():
    chunks = replay_as_sse_chunks(CACHED, "auto", "req-2")
    lines = list(sse_lines(chunks))
    assert lines[-1] == b"data: [DONE]\n\n"
    parsed = [json.loads(line[len(b"data: "):]) for line in lines[:-1]]
    back = assemble_stream(parsed)
    assert back["choices"] == CACHED["choices"] and back["usage"] == CACHED["usage"]


def test_tool_calls_and_length_finish_are_replayed():
    cached = {"choices": [{"index": 0, "finish_reason": "length", "message": {
        "role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "lookup", "arguments": "{\"sku\": \"SKU-1\"}"}}]}}]}
    chunks = replay_as_sse_chunks(cached, "auto", "r")
    back = assemble_stream(chunks)
    assert back["choices"][0]["finish_reason"] == "length"
    assert back["choices"][0]["message"]["tool_calls"] == cached["choices"][0]["message"]["tool_calls"]
