"""Checks on a chat completion body, each failure naming its field (OpenAI ``param``)."""
from __future__ import annotations

import re
from typing import Any

import orjson

from app.gateway.errors import bad_request

ROLES = {"system", "developer", "user", "assistant", "tool", "function"}
# The request fields a client may send: OpenAI's chat completion parameters, and the
# sampling extras vLLM accepts. Engine-only fields (cache_salt, priority, chat_template,
# kv_transfer_params, structured_outputs, guided_*, ...) are set by the gateway from
# policy and never taken from a client (security finding 7).
CLIENT_FIELDS = frozenset({
    "model", "messages", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs",
    "max_tokens", "max_completion_tokens", "n", "presence_penalty", "response_format",
    "seed", "stop", "stream", "stream_options", "temperature", "top_p", "tools",
    "tool_choice", "parallel_tool_calls", "user", "functions", "function_call", "metadata",
    "store", "reasoning_effort", "modalities", "prediction", "service_tier",
    "top_k", "min_p", "repetition_penalty", "min_tokens", "stop_token_ids", "ignore_eos"})
MAX_DEPTH = 64   # response_format / tools nesting (a schema is walked recursively)
_NUMBERS = {"temperature": (0.0, 2.0), "top_p": (0.0, 1.0),
            "presence_penalty": (-2.0, 2.0), "frequency_penalty": (-2.0, 2.0)}


def parse_json(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"We could not parse the JSON body of your request: {exc}",
                          code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.", code="invalid_json")
    return body


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_messages(messages: Any) -> None:
    if messages is None:
        raise bad_request("Missing required parameter: 'messages'.", "messages",
                          "missing_required_parameter")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty array.", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad_request(f"messages[{i}] must be an object.", f"messages[{i}]")
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise bad_request(f"Invalid value for 'messages[{i}].role': {role!r}.",
                              f"messages[{i}].role")
        content = m.get("content")
        if content is None and role == "assistant" and (m.get("tool_calls")
                                                        or m.get("function_call")):
            continue
        if not isinstance(content, (str, list)):
            raise bad_request(f"Invalid type for 'messages[{i}].content': expected a string "
                              "or an array of content parts.", f"messages[{i}].content",
                              "invalid_type")
        if isinstance(content, list):
            _check_parts(content, f"messages[{i}].content")


def _check_parts(parts: list, where: str) -> None:
    """Content parts: objects with a string ``type``; a text part's ``text`` is a string."""
    for j, part in enumerate(parts):
        at = f"{where}[{j}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise bad_request(f"Invalid content part '{at}': expected an object with a "
                              "string 'type'.", at, "invalid_type")
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            raise bad_request(f"Invalid content part '{at}': 'text' must be a string.",
                              f"{at}.text", "invalid_type")


_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def _check_tools(body: dict[str, Any]) -> None:
    """``tools`` and ``tool_choice`` as OpenAI checks them: an array of function tools,
    each named by ``^[a-zA-Z0-9_-]{1,64}$`` (once) with object ``parameters``; a
    ``tool_choice`` of none/auto/required or naming a declared function (required or a
    name only with ``tools``). Before, a nameless or misnamed tool went on to retrieval and the engine."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is not None:
        if not isinstance(tools, list):
            raise bad_request("Invalid type for 'tools': expected an array of tools.",
                              "tools", "invalid_type")
        seen: set[str] = set()
        for i, tool in enumerate(tools):
            at = f"tools[{i}]"
            if not isinstance(tool, dict) or tool.get("type") != "function" \
                    or not isinstance(tool.get("function"), dict):
                raise bad_request(f"Invalid '{at}': expected an object with type 'function' "
                                  "and a 'function' object.", at, "invalid_type")
            fn = tool["function"]
            name = fn.get("name")
            if not isinstance(name, str) or not _TOOL_NAME.match(name):
                raise bad_request(f"Invalid '{at}.function.name': {name!r} does not match "
                                  "the pattern '^[a-zA-Z0-9_-]{1,64}$'.",
                                  f"{at}.function.name", "invalid_value")
            if name in seen:
                raise bad_request(f"Invalid '{at}.function.name': {name!r} is declared "
                                  "twice; tool names must be unique.",
                                  f"{at}.function.name", "invalid_value")
            seen.add(name)
            if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
                raise bad_request(f"Invalid type for '{at}.function.parameters': expected "
                                  "a JSON schema object.", f"{at}.function.parameters",
                                  "invalid_type")
            if fn.get("description") is not None and not isinstance(fn["description"], str):
                raise bad_request(f"Invalid type for '{at}.function.description': expected "
                                  "a string.", f"{at}.function.description", "invalid_type")
    if choice is None:
        return
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise bad_request(f"Invalid value for 'tool_choice': {choice!r}; expected none, "
                              "auto, required or a named function.", "tool_choice",
                              "invalid_value")
    elif not (isinstance(choice, dict) and choice.get("type") == "function"
              and isinstance(choice.get("function"), dict)
              and isinstance(choice["function"].get("name"), str)):
        raise bad_request("Invalid 'tool_choice': expected none, auto, required or "
                          "{\"type\": \"function\", \"function\": {\"name\": ...}}.",
                          "tool_choice", "invalid_type")
    if not tools:
        if choice in ("none", "auto"):   # nothing to choose from: as without tool_choice
            return
        raise bad_request("Invalid value for 'tool_choice': 'tool_choice' is only allowed "
                          "when 'tools' are specified.", "tool_choice", "invalid_value")
    if isinstance(choice, dict):
        name = choice["function"]["name"]
        if name not in {t["function"]["name"] for t in tools}:
            raise bad_request(f"Invalid value for 'tool_choice': function {name!r} is not "
                              "among 'tools'.", "tool_choice", "invalid_value")


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of a JSON value, counting no further than ``limit`` + 1."""
    stack, deepest = [(value, 1)], 0
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        if deepest > limit:
            return deepest
        children = node.values() if isinstance(node, dict) else node \
            if isinstance(node, list) else ()
        stack.extend((c, d + 1) for c in children if isinstance(c, (dict, list)))
    return deepest


def check_chat_body(body: dict[str, Any], max_tokens_cap: int) -> None:
    """Raise a 400 GatewayError for the first invalid field; clamps max tokens to the cap."""
    unknown = sorted(k for k in body if k not in CLIENT_FIELDS)
    if unknown:
        raise bad_request(f"Unrecognized request argument supplied: {unknown[0]}", unknown[0],
                          "unrecognized_argument")
    model = body.get("model")
    if model is None:
        raise bad_request("Missing required parameter: 'model'.", "model",
                          "missing_required_parameter")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' must be a non-empty string.", "model", "invalid_type")
    _check_messages(body.get("messages"))
    if "stream" in body and body["stream"] is not None and not isinstance(body["stream"], bool):
        raise bad_request("'stream' must be a boolean.", "stream", "invalid_type")
    opts = body.get("stream_options")
    if opts is not None:
        if not isinstance(opts, dict):
            raise bad_request("'stream_options' must be an object.", "stream_options",
                              "invalid_type")
        if not body.get("stream"):
            raise bad_request("'stream_options' is only allowed when 'stream' is true.",
                              "stream_options")
    for name, (lo, hi) in _NUMBERS.items():
        v = body.get(name)
        if v is not None and (not _is_number(v) or not lo <= v <= hi):
            raise bad_request(f"Invalid '{name}': must be a number between {lo:g} and {hi:g}.",
                              name, "invalid_value")
    for name in ("max_tokens", "max_completion_tokens"):
        v = body.get(name)
        if v is None:
            continue
        if not _is_int(v) or v < 1:
            raise bad_request(f"Invalid '{name}': must be a positive integer.", name)
        if v > max_tokens_cap:
            body[name] = max_tokens_cap
    n = body.get("n")
    if n is not None and (not _is_int(n) or not 1 <= n <= 128):
        raise bad_request("Invalid 'n': must be an integer between 1 and 128.", "n")
    if body.get("logprobs") is not None and not isinstance(body["logprobs"], bool):
        raise bad_request("'logprobs' must be a boolean.", "logprobs", "invalid_type")
    top = body.get("top_logprobs")
    if top is not None and (not _is_int(top) or not 0 <= top <= 20):
        raise bad_request("Invalid 'top_logprobs': must be an integer between 0 and 20.",
                          "top_logprobs")
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") not in
                            ("text", "json_object", "json_schema")):
        raise bad_request("Invalid 'response_format': type must be text, json_object or "
                          "json_schema.", "response_format.type")
    for name in ("response_format", "tools"):
        if body.get(name) is not None and _depth(body[name], MAX_DEPTH) > MAX_DEPTH:
            raise bad_request(f"Invalid '{name}': nested deeper than {MAX_DEPTH} levels.",
                              name, "invalid_value")
    _check_tools(body)
