"""Tool calls on the reference engine: vLLM's tool API (forced through guided decoding,
auto through the Hermes parser), parallel calls, tool results and streamed deltas."""
from __future__ import annotations

import json

import pytest

from app.engine import tools
from tests.engine.conftest import EngineProcess

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a timezone",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 12}},
                   "required": ["tz"], "additionalProperties": False}}}
# Two earlier turns in which the assistant called the tool: SmolLM2-135M was not trained
# on tool calls, but it follows the pattern of the conversation.
FEW_SHOT = [
    {"role": "user", "content": "What is the weather in Rome?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
    {"role": "user", "content": "What is the weather in Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c2", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}]


def _reassemble(deltas: list[dict]) -> tuple[str, list[dict]]:
    """(content, calls) from OpenAI streaming deltas, as the OpenAI SDK accumulates them."""
    content, calls = "", {}
    for d in deltas:
        content += d.get("content") or ""
        for tc in d.get("tool_calls") or []:
            call = calls.setdefault(tc["index"], {"id": None, "name": "", "arguments": ""})
            call["id"] = tc.get("id") or call["id"]
            fn = tc.get("function") or {}
            call["name"] += fn.get("name") or ""
            call["arguments"] += fn.get("arguments") or ""
    return content, [calls[i] for i in sorted(calls)]


@pytest.mark.parametrize("mode,text", [
    ("named", '{"city": "Paris"}'),
    ("required", '[{"name": "get_weather", "parameters": {"city": "Paris"}}, '
                 '{"name": "get_time", "parameters": {"tz": "CET"}}]'),
    ("auto", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": '
             '{"city": "Pa\\"ris}"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", '
             '"arguments": {"tz": "CET"}}\n</tool_call>'),
    ("auto", "No tools needed: a < b and <tool is not a call."),
])
@pytest.mark.parametrize("step", [1, 3, 1000])
def test_stream_deltas_reassemble_to_the_parsed_answer(mode, text, step):
    plan = tools.ToolPlan([WEATHER["function"], CLOCK["function"]], mode,
                          name="get_weather" if mode == "named" else None)
    want_content, want_calls = tools.parse_output(plan, text)
    stream = tools.ToolCallStream(plan)
    deltas = [d for i in range(0, len(text), step) for d in stream.feed(text[i:i + step])]
    deltas += stream.finish()
    content, calls = _reassemble(deltas)
    # streamed text before a call keeps its trailing blank (it went out before the call)
    assert content.strip() == (want_content or "").strip()
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == \
        [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in want_calls]
    assert all(c["id"] for c in calls)
    if mode == "auto" and want_calls:
        assert want_calls[0]["function"]["arguments"] == '{"city": "Pa\\"ris}"}'


def test_tool_results_and_earlier_calls_render_for_a_tool_unaware_template():
    msgs = tools.render_messages(
        [{"role": "user", "content": "weather?"}, *FEW_SHOT[1:2],
         {"role": "tool", "tool_call_id": "c1", "content": '{"temp_c": 21}'}],
        [WEATHER["function"]])
    assert msgs[0]["role"] == "system" and '"name": "get_weather"' in msgs[0]["content"]
    assert msgs[2]["content"] == ('<tool_call>\n{"name": "get_weather", "arguments": '
                                  '{"city": "Rome"}}\n</tool_call>')
    assert msgs[3] == {"role": "user", "content": '<tool_response>\n{"temp_c": 21}\n'
                                                  '</tool_response>'}


@pytest.fixture(scope="module")
def tool_engine(tiny_model, tmp_path_factory):
    eng = EngineProcess(str(tiny_model), "tiny", tmp_path_factory.mktemp("log") / "tools.log",
                        extra=["--enable-auto-tool-choice", "--tool-call-parser", "hermes"])
    try:
        eng.wait_healthy()
        yield eng
    finally:
        eng.stop()


def _calls(resp) -> list[tuple[str, dict]]:
    assert resp.status_code == 200, resp.text
    msg = resp.json()["choices"][0]["message"]
    return [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in msg["tool_calls"]]


def test_forced_calls_are_valid_even_from_a_random_model(tool_engine):
    named = tool_engine.chat("hi", tools=[WEATHER, CLOCK], max_tokens=60,
                             tool_choice={"type": "function", "function": {"name": "get_time"}})
    [(name, args)] = _calls(named)
    assert name == "get_time" and set(args) == {"tz"}
    assert named.json()["choices"][0]["finish_reason"] == "stop"  # as OpenAI: forced name
    required = tool_engine.chat("hi", tools=[WEATHER, CLOCK], tool_choice="required",
                                max_tokens=120, seed=3, temperature=1.0)
    calls = _calls(required)
    assert calls and all(n in ("get_weather", "get_time") for n, _ in calls)
    assert required.json()["choices"][0]["finish_reason"] in ("tool_calls", "length")
    single = tool_engine.chat("hi", tools=[WEATHER, CLOCK], tool_choice="required",
                              parallel_tool_calls=False, max_tokens=120)
    assert len(_calls(single)) == 1


def test_a_tool_sent_by_name_alone_is_called_with_no_arguments(tool_engine):
    # tool retrieval's name tier sends {"name": ...} without parameters (optional in
    # OpenAI's and vLLM's function definitions): the engine takes it as a function of no
    # parameters, and the gateway retries a call its full schema rejects
    bare = {"type": "function", "function": {"name": "get_time"}}
    named = tool_engine.chat("hi", tools=[WEATHER, bare], max_tokens=60,
                             tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert _calls(named) == [("get_time", {})]
    required = tool_engine.chat("hi", tools=[WEATHER, bare], tool_choice="required",
                                max_tokens=120, seed=3, temperature=1.0)
    calls = _calls(required)
    assert calls and all(args == {} for n, args in calls if n == "get_time")


def test_streamed_forced_call_matches_the_unstreamed_one(tool_engine):
    kw = {"tools": [WEATHER, CLOCK], "tool_choice": "required", "max_tokens": 80}
    whole = _calls(tool_engine.chat("hi", **kw))
    lines = [ln[6:] for ln in tool_engine.chat("hi", stream=True, **kw).text.splitlines()
             if ln.startswith("data: ") and ln != "data: [DONE]"]
    chunks = [json.loads(ln) for ln in lines]
    _, calls = _reassemble([c["choices"][0]["delta"] for c in chunks if c["choices"]])
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == whole
    first = [c for c in chunks if c["choices"][0]["delta"].get("tool_calls")][0]
    head = first["choices"][0]["delta"]["tool_calls"][0]
    assert head["type"] == "function" and head["id"].startswith("chatcmpl-tool-")


def test_tool_api_errors_read_like_vllm(tool_engine, tiny_model, tmp_path):
    r = tool_engine.chat("hi", tools=[WEATHER],
                         tool_choice={"type": "function", "function": {"name": "nope"}})
    assert r.status_code == 400 and "has not been passed in `tools`" in r.text
    r = tool_engine.chat("hi", tool_choice="required")
    assert r.status_code == 400 and "`tools` must be set" in r.text
    r = tool_engine.chat("hi", tools=[{"type": "function", "function": {"description": "x"}}])
    assert r.status_code == 400
    plain = EngineProcess(str(tiny_model), "tiny", tmp_path / "plain.log")
    try:
        plain.wait_healthy()
        r = plain.chat("hi", tools=[WEATHER], tool_choice="auto")
        assert r.status_code == 400 and "--enable-auto-tool-choice" in r.text
        assert _calls(plain.chat("hi", tools=[WEATHER], tool_choice="required", max_tokens=40))
    finally:
        plain.stop()


def test_a_conversation_with_tool_results_is_served(tool_engine):
    msgs = [{"role": "user", "content": "Weather in Rome?"}, *FEW_SHOT[1:2],
            {"role": "tool", "tool_call_id": "c1", "content": '{"temp_c": 21}'}]
    r = tool_engine.chat(msgs, tools=[WEATHER], tool_choice="none", max_tokens=8)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["tool_calls"] == []
    # the tool result is part of the prompt: a different result changes its last blocks
    other = [*msgs[:-1], {**msgs[-1], "content": '{"temp_c": 3, "wind": "strong"}'}]
    r2 = tool_engine.chat(other, tools=[WEATHER], tool_choice="none", max_tokens=8)
    usage = r2.json()["usage"]
    assert usage["prompt_tokens"] > r.json()["usage"]["prompt_tokens"]
    assert usage["prompt_tokens_details"]["cached_tokens"] <= usage["prompt_tokens"] - 16
