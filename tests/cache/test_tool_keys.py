"""Cache keys of tool traffic: the tool set, the tool choice and the tool results are part
of what two requests must share to share an answer (exact and semantic)."""
from __future__ import annotations

from app.contract.cache.keys import build_key, is_cacheable_response
from app.contract.policy import DEFAULTS


def _tool(name: str, desc: str = "") -> dict:
    return {"type": "function", "function": {"name": name, "description": desc,
                                             "parameters": {"type": "object", "properties": {
                                                 "city": {"type": "string"}}}}}


ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function",
     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}


def _key(messages, tools, **kw):
    return build_key("t1", DEFAULTS, "auto", {"messages": messages, "tools": tools,
                                              "temperature": 0, **kw})


def test_another_tool_set_or_choice_never_shares_an_answer():
    base = _key(ASK, [_tool("get_weather")])
    assert base == _key(ASK, [_tool("get_weather")])
    for other in (_key(ASK, [_tool("get_weather"), _tool("get_time")]),
                  _key(ASK, [_tool("get_weather", "Weather now")]),
                  _key(ASK, [_tool("get_weather")], tool_choice="required"),
                  _key(ASK, [])):
        assert other.exact_hash != base.exact_hash
        assert other.composite != base.composite   # no semantic match either


def test_tool_results_after_the_question_are_part_of_the_key():
    sunny = _key([*ASK, CALL, {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
                 [_tool("get_weather")])
    rainy = _key([*ASK, CALL, {"role": "tool", "tool_call_id": "c1", "content": "rain"}],
                 [_tool("get_weather")])
    asked = _key(ASK, [_tool("get_weather")])
    # same question text, so only the composite keeps the semantic cache apart
    assert sunny.text == rainy.text == asked.text
    assert len({sunny.composite, rainy.composite, asked.composite}) == 3
    assert len({sunny.exact_hash, rainy.exact_hash, asked.exact_hash}) == 3


def test_a_complete_tool_call_answer_is_cacheable():
    call = {"role": "assistant", "content": None, "tool_calls": CALL["tool_calls"]}
    assert is_cacheable_response({"choices": [{"message": call, "finish_reason": "tool_calls"}]})
    assert not is_cacheable_response({"choices": [{"message": call, "finish_reason": "abort"}]})
