"""Agents end to end (issue 23): the official OpenAI SDK and LangChain against the running
gateway, whose pool is the reference engine serving SmolLM2-135M with vLLM's tool flags.
Forced, required, auto, parallel and streamed tool calls; a cached tool call is served
only for the same tool set; S02 minifies a tool's parameter keys and the client gets its
own keys back, streamed; a multi-turn agent loop runs a tool and answers from its result.

SmolLM2-135M was not trained on tool calls: the conversations start with two earlier
turns in which the assistant called the tool, and the model follows that pattern."""
from __future__ import annotations

import json

import pytest

from tests.engine.conftest import EngineProcess
from tests.engine.test_tools import CLOCK, FEW_SHOT, WEATHER
from tests.gateway.conftest import make_world, wait_for

PARIS = {"role": "user", "content": "What is the weather in Paris?"}
# two earlier turns that each called both tools at once
PARALLEL_SHOT = [
    {"role": "user", "content": "What is the weather in Rome and the time in Tokyo?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "p1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
        {"id": "p2", "type": "function",
         "function": {"name": "get_time", "arguments": '{"tz": "Tokyo"}'}}]},
    {"role": "user", "content": "What is the weather in Oslo and the time in Lima?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "p3", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
        {"id": "p4", "type": "function",
         "function": {"name": "get_time", "arguments": '{"tz": "Lima"}'}}]}]


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    from app.engine.model import ensure_smollm2
    ensure_smollm2()
    eng = EngineProcess("smollm2", "tiny-served", tmp_path_factory.mktemp("agent") / "e.log",
                        extra=["--enable-auto-tool-choice", "--tool-call-parser", "hermes"])
    try:
        eng.wait_healthy(timeout_s=240)
        yield eng
    finally:
        eng.stop()


def _calls(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments))
            for c in message.tool_calls or []]


@pytest.mark.slow
def test_openai_sdk_forced_required_auto_parallel_streamed_and_cached(app, gateway, frontier,
                                                                      smol, redis_client):
    w = make_world(app, gateway, [smol.url], frontier.url)
    client = w.client(timeout=120)
    kw = {"model": "tier-1", "temperature": 0, "max_tokens": 40, "tools": [WEATHER, CLOCK]}
    forced = client.chat.completions.create(
        messages=[*FEW_SHOT, PARIS], **kw,
        tool_choice={"type": "function", "function": {"name": "get_time"}})
    [(name, args)] = _calls(forced.choices[0].message)
    assert name == "get_time" and set(args) == {"tz"}

    required = client.chat.completions.create(messages=[*FEW_SHOT, PARIS], **kw,
                                              tool_choice="required")
    assert _calls(required.choices[0].message) == [("get_weather", {"city": "Paris"})]
    assert required.choices[0].finish_reason == "tool_calls"

    auto = client.chat.completions.create(
        messages=[*PARALLEL_SHOT, {"role": "user", "content":
                                   "What is the weather in Paris and the time in Berlin?"}],
        **{**kw, "max_tokens": 90}, tool_choice="auto")
    assert _calls(auto.choices[0].message) == [("get_weather", {"city": "Paris"}),
                                               ("get_time", {"tz": "Berlin"})], auto
    assert len({c.id for c in auto.choices[0].message.tool_calls}) == 2

    # streamed: OpenAI's deltas (id, type and name first, then argument fragments)
    stream = client.chat.completions.create(messages=[*FEW_SHOT, PARIS], stream=True,
                                            **{**kw, "max_tokens": 41}, tool_choice="auto")
    name, args, ids, finish = "", "", set(), None
    for chunk in stream:
        for choice in chunk.choices:
            for tc in choice.delta.tool_calls or []:
                ids.add(tc.id) if tc.id else None
                name += tc.function.name or "" if tc.function else ""
                args += tc.function.arguments or "" if tc.function else ""
            finish = choice.finish_reason or finish
    assert (name, json.loads(args), len(ids), finish) == \
        ("get_weather", {"city": "Paris"}, 1, "tool_calls")

    # the same request again is a cache hit; with another tool set it never is
    ns = app.config["REDIS_NAMESPACE"]
    wait_for(lambda: redis_client.scard(f"{ns}:cache:t:{w.tenant.id}") >= 4, what="cache")
    again = client.chat.completions.with_raw_response.create(
        messages=[*FEW_SHOT, PARIS], **kw, tool_choice="required")
    assert again.headers["x-sluice-cache"] == "exact"
    assert _calls(again.parse().choices[0].message) == [("get_weather", {"city": "Paris"})]
    other = client.chat.completions.with_raw_response.create(
        messages=[*FEW_SHOT, PARIS], **{**kw, "tools": [WEATHER]}, tool_choice="required")
    assert other.headers["x-sluice-cache"] == "miss"

    rows = w.drain_rows(6)
    assert [r.cache for r in rows] == ["miss"] * 4 + ["exact", "miss"]
    assert all(r.tool_tokens > 40 for r in rows if r.cache == "miss")
    assert rows[5].tool_tokens < rows[1].tool_tokens   # one tool's definition, not two


@pytest.mark.slow
def test_minified_tool_keys_come_back_as_the_clients_own_streamed(app, gateway, frontier, smol):
    w = make_world(app, gateway, [smol.url], frontier.url, policy={"minify_tools": True})
    forecast = {"type": "function", "function": {
        "name": "get_weather", "description": "Weather forecast for a city",
        "parameters": {"type": "object", "properties": {
            "destination_city_name": {"type": "string", "maxLength": 12},
            "forecast_day_offset": {"type": "integer", "minimum": 0, "maximum": 6}},
            "required": ["destination_city_name", "forecast_day_offset"],
            "additionalProperties": False}}}
    stream = w.client(timeout=120).chat.completions.create(
        model="tier-1", temperature=0, max_tokens=40, stream=True, tools=[forecast],
        messages=[{"role": "user", "content": "Weather in Paris tomorrow?"}],
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    args = "".join(tc.function.arguments or "" for c in stream for ch in c.choices
                   for tc in ch.delta.tool_calls or [] if tc.function)
    assert set(json.loads(args)) == {"destination_city_name", "forecast_day_offset"}
    [row] = w.drain_rows(1)
    assert row.payload["pipeline"]["minify"]["tools"] == ["get_weather"]  # sent minified


@pytest.mark.slow
def test_langchain_agent_loop_runs_the_tool_and_answers_from_its_result(app, gateway, frontier,
                                                                       smol):
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather for a city"""
        return json.dumps({"city": city, "temp_c": 18, "sky": "sunny"})

    w = make_world(app, gateway, [smol.url], frontier.url)
    llm = ChatOpenAI(base_url=w.base_url, api_key=w.key, model="tier-1", temperature=0,
                     max_tokens=40, max_retries=0, timeout=120)
    history = [HumanMessage("What is the weather in Rome?"),
               AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": "Rome"},
                                          "id": "c1"}]),
               HumanMessage("What is the weather in Oslo?"),
               AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": "Oslo"},
                                          "id": "c2"}]),
               HumanMessage("What is the weather in Paris?")]
    agent = llm.bind_tools([get_weather], tool_choice="auto")
    step = agent.invoke(history)
    assert [(c["name"], c["args"]) for c in step.tool_calls] == [("get_weather",
                                                                 {"city": "Paris"})]
    history += [step, get_weather.invoke(step.tool_calls[0])]   # run it: a ToolMessage
    assert isinstance(history[-1], ToolMessage)
    final = llm.bind_tools([get_weather], tool_choice="none").invoke(history)
    assert not final.tool_calls and "18" in final.content   # read from the tool's result
    forced = llm.bind_tools([get_weather], tool_choice="get_weather").invoke(history[:5])
    assert forced.tool_calls[0]["name"] == "get_weather"
    rows = w.drain_rows(3)
    assert all(r.tool_tokens > 0 and r.status == 200 for r in rows)
