"""Tool calls in the reference engine, as vLLM serves them.

- ``tools`` / ``tool_choice`` (none, auto, required, a named function) are checked as
  vLLM's OpenAI server checks them; ``auto`` needs ``--enable-auto-tool-choice``.
- A named or required choice is forced with guided decoding, the way vLLM forces them:
  a named call decodes the function's ``parameters`` schema; ``required`` decodes a JSON
  array of ``{"name", "parameters"}`` objects (``minItems`` 1, one item when
  ``parallel_tool_calls`` is false).
- ``auto`` is read from the text by a Hermes parser (vLLM's ``--tool-call-parser hermes``:
  ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``). The engine also guides it
  with an xgrammar structural tag triggered by ``<tool_call>``, so a call the model
  starts is always valid JSON for one of the tools; text before it is free.
- Chat templates that ignore ``tools`` (SmolLM2's) get the tool block, earlier calls and
  tool results rendered in Hermes/Qwen form before the template runs.
- ``ToolCallStream`` turns generated text into OpenAI streaming deltas: content, then one
  ``tool_calls`` delta per call carrying id, type and name, then argument fragments.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from app.engine.core import EngineError, text_of_parts

PARSERS = ("hermes",)
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"

TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n")
TOOLS_POSTAMBLE = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
DEFAULT_SYSTEM = "You are a helpful AI assistant."
EMPTY_PARAMETERS = {"type": "object", "properties": {}}


@dataclass
class ToolPlan:
    """What the request asks of tools: ``mode`` is none, auto, required or named."""

    tools: list[dict]
    mode: str
    name: str | None = None
    parallel: bool = True
    constraint: dict | None = field(default=None)

    @property
    def parses(self) -> bool:
        return self.mode in ("auto", "required", "named")


def _function(tool: Any) -> dict:
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        raise EngineError("each tool must be {'type': 'function', 'function': {...}}")
    fn = tool.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise EngineError("each tool needs function.name")
    params = fn.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise EngineError(f"tool {fn['name']}: function.parameters must be an object")
    return fn


def plan_tools(body: dict, *, auto_enabled: bool) -> ToolPlan | None:
    """The request's tool plan, or None when it has no tools (or tool_choice none with
    none given). Raises EngineError with vLLM's messages for what vLLM refuses."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools is None or tools == []:
        if choice not in (None, "none"):
            raise EngineError("When using `tool_choice`, `tools` must be set.")
        return None
    if not isinstance(tools, list):
        raise EngineError("'tools' must be a list")
    functions = [_function(t) for t in tools]
    names = [f["name"] for f in functions]
    if len(set(names)) != len(names):
        raise EngineError("tool names must be unique")
    parallel = body.get("parallel_tool_calls") is not False
    if choice is None:
        choice = "auto"
    if choice == "none":
        return ToolPlan(functions, "none", parallel=parallel)
    if choice == "auto":
        if not auto_enabled:
            raise EngineError('"auto" tool choice requires --enable-auto-tool-choice and '
                              "--tool-call-parser to be set")
        return ToolPlan(functions, "auto", parallel=parallel,
                        constraint=_auto_constraint(functions))
    if choice == "required":
        return ToolPlan(functions, "required", parallel=parallel,
                        constraint=_required_constraint(functions, parallel))
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        match = [f for f in functions if f["name"] == name]
        if not match:
            raise EngineError(f"Tool '{name}' has not been passed in `tools`.")
        return ToolPlan(functions, "named", name=name, parallel=parallel, constraint={
            "type": "json_schema",
            "json_schema": {"schema": match[0].get("parameters") or EMPTY_PARAMETERS}})
    raise EngineError(f"invalid tool_choice {choice!r}: 'none', 'auto', 'required' or "
                      "{'type': 'function', 'function': {'name': ...}}")


def _required_constraint(functions: list[dict], parallel: bool) -> dict:
    """vLLM's schema for ``tool_choice="required"``: a non-empty array of calls."""
    items = [{"type": "object",
              "properties": {"name": {"type": "string", "enum": [f["name"]]},
                             "parameters": f.get("parameters") or EMPTY_PARAMETERS},
              "required": ["name", "parameters"]} for f in functions]
    schema: dict[str, Any] = {"type": "array", "minItems": 1,
                              "items": {"type": "object", "anyOf": items}}
    if not parallel:
        schema["maxItems"] = 1
    return {"type": "json_schema", "json_schema": {"schema": schema}}


def _auto_constraint(functions: list[dict]) -> dict:
    """A structural tag: free text, but once ``<tool_call>`` is generated the call must
    be ``{"name": <one of the tools>, "arguments": <its parameters>}``."""
    return {"type": "structural_tag", "triggers": [CALL_OPEN], "structures": [
        {"begin": f'{CALL_OPEN}\n{{"name": {json.dumps(f["name"])}, "arguments": ',
         "schema": f.get("parameters") or EMPTY_PARAMETERS, "end": f"}}\n{CALL_CLOSE}"}
        for f in functions]}


# -- prompts ---------------------------------------------------------------------------------
def tools_block(functions: list[dict]) -> str:
    lines = "\n".join(json.dumps({"type": "function", "function": f}, ensure_ascii=False)
                      for f in functions)
    return TOOLS_PREAMBLE + lines + TOOLS_POSTAMBLE


def _call_text(call: Any) -> str:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise EngineError("each tool_calls item needs function.name")
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            raise EngineError(f"tool call {fn['name']}: arguments are not valid JSON") from None
    body = json.dumps({"name": fn["name"], "arguments": args}, ensure_ascii=False)
    return f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}"


def render_messages(messages: list[dict], functions: list[dict] | None) -> list[dict]:
    """Messages a tool-unaware chat template can render: the tool block joins the system
    message, an assistant's ``tool_calls`` become ``<tool_call>`` text, and ``tool``
    results become user turns holding ``<tool_response>`` (Qwen2.5's Hermes layout)."""
    out: list[dict] = []
    for m in messages:
        role = m.get("role")
        if role == "assistant" and m.get("tool_calls"):
            if not isinstance(m["tool_calls"], list):
                raise EngineError("tool_calls must be a list")
            parts = [m.get("content") or ""] if m.get("content") else []
            parts += [_call_text(c) for c in m["tool_calls"]]
            out.append({"role": "assistant", "content": "\n".join(parts)})
        elif role == "tool":
            content = m.get("content")
            if isinstance(content, list):
                content = text_of_parts(content)
            out.append({"role": "user",
                        "content": f"<tool_response>\n{content or ''}\n</tool_response>"})
        else:
            out.append({k: v for k, v in m.items() if k != "tool_calls"})
    if functions:
        block = tools_block(functions)
        if out and out[0].get("role") == "system" and isinstance(out[0].get("content"), str):
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{block}"}
        else:
            out.insert(0, {"role": "system", "content": f"{DEFAULT_SYSTEM}\n\n{block}"})
    return out


# -- parsing ---------------------------------------------------------------------------------
def new_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def _call(name: str, arguments: Any, index: int | None = None) -> dict:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments,
                                                                   ensure_ascii=False)
    call = {"id": new_call_id(), "type": "function",
            "function": {"name": name, "arguments": args}}
    if index is not None:
        call["index"] = index
    return call


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>|<tool_call>\s*(.*)", re.DOTALL)


def parse_output(plan: ToolPlan, text: str) -> tuple[str | None, list[dict]]:
    """(content, tool_calls) of a finished generation."""
    if plan.mode == "named":
        return None, [_call(plan.name, text)]
    if plan.mode == "required":
        try:
            items = json.loads(text)
            calls = [_call(i["name"], i.get("parameters", {})) for i in items]
        except (ValueError, TypeError, KeyError):
            return text, []
        return None, calls
    if plan.mode != "auto" or CALL_OPEN not in text:
        return text, []
    calls = []
    for closed, unclosed in _HERMES.findall(text):
        try:
            obj = json.loads(closed or unclosed)
            calls.append(_call(obj["name"], obj.get("arguments", {})))
        except (ValueError, TypeError, KeyError):
            return text, []  # as vLLM's parser: an unreadable call leaves the text as is
    if not plan.parallel:
        calls = calls[:1]
    content = text[:text.index(CALL_OPEN)].strip()
    return content or None, calls


def json_value_end(text: str, start: int) -> int | None:
    """Index just past the JSON object or array starting at ``text[start]`` (after
    whitespace), or None while it is incomplete."""
    depth, in_str, esc = 0, False, False
    i = start
    while i < len(text) and text[i].isspace():
        i += 1
    for j in range(i, len(text)):
        ch = text[j]
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return j + 1
    return None


_AUTO_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')
_OBJECT_CLOSE, _ARRAY_CLOSE = re.compile(r"\s*\}"), re.compile(r"\s*\]")
_REQUIRED_HEAD = re.compile(r'\s*[\[,]\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,'
                            r'\s*"parameters"\s*:\s*')


class ToolCallStream:
    """Incremental parse of the generated text into OpenAI ``delta`` objects."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.text = ""
        self.pos = 0            # how far the text has been turned into deltas
        self.calls = 0          # tool calls started
        self.args_from: int | None = None  # start of the current call's arguments
        self.args_sent = 0      # characters of them already sent
        self.done = False       # no more calls can follow
        self.closing = False    # required: waiting for the "}" that ends a call

    def feed(self, delta: str) -> list[dict]:
        self.text += delta
        return self._advance(final=False)

    def finish(self) -> list[dict]:
        return self._advance(final=True)

    @property
    def called(self) -> bool:
        return self.calls > 0

    def _start(self, name: str) -> dict:
        self.calls += 1
        return {"tool_calls": [{"index": self.calls - 1, "id": new_call_id(),
                                "type": "function", "function": {"name": name,
                                                                  "arguments": ""}}]}

    def _args(self, upto: int) -> list[dict]:
        if not self.args_sent:  # arguments start at their first non-blank character
            while self.args_from < upto and self.text[self.args_from].isspace():
                self.args_from += 1
        start = self.args_from + self.args_sent
        if upto <= start:
            return []
        self.args_sent = upto - self.args_from
        return [{"tool_calls": [{"index": self.calls - 1,
                                 "function": {"arguments": self.text[start:upto]}}]}]

    def _arguments(self) -> tuple[list[dict], bool]:
        """Argument fragments of the open call; True once its JSON value is complete."""
        end = json_value_end(self.text, self.args_from)
        out = self._args(end if end is not None else len(self.text))
        if end is not None:
            self.pos, self.args_from, self.args_sent = end, None, 0
        return out, end is not None

    def _advance(self, final: bool) -> list[dict]:
        mode = self.plan.mode
        if mode == "named":
            if self.args_from is None and not self.calls:
                self.args_from = 0
                out = [self._start(self.plan.name)]
            else:
                out = []
            if self.args_from is not None:
                out += self._args(len(self.text))
            return out
        if mode == "required":
            return self._advance_required(final)
        if mode == "auto":
            return self._advance_auto(final)
        return self._content(len(self.text))

    def _content(self, upto: int) -> list[dict]:
        if upto <= self.pos:
            return []
        piece, self.pos = self.text[self.pos:upto], upto
        return [{"content": piece}]

    def _advance_required(self, final: bool) -> list[dict]:
        out: list[dict] = []
        while not self.done:
            if self.args_from is not None:
                frags, complete = self._arguments()
                out += frags
                if not complete:
                    break
                self.closing = True
            if self.closing:  # the call object's own "}" after its parameters
                close = _OBJECT_CLOSE.match(self.text, self.pos)
                if not close:
                    break
                self.pos, self.closing = close.end(), False
                continue
            if _ARRAY_CLOSE.match(self.text, self.pos):
                self.done = True
                break
            head = _REQUIRED_HEAD.match(self.text, self.pos)
            if not head:
                break
            out.append(self._start(json.loads(f'"{head.group(1)}"')))
            self.args_from, self.args_sent = head.end(), 0
            self.pos = head.end()
        return out

    def _advance_auto(self, final: bool) -> list[dict]:
        out: list[dict] = []
        while True:
            if self.args_from is not None:
                frags, complete = self._arguments()
                out += frags
                if not complete:
                    return out
                close = self.text.find(CALL_CLOSE, self.pos)
                if close == -1:
                    return out
                self.pos = close + len(CALL_CLOSE)
                if not self.plan.parallel:
                    self.done = True
                continue
            if self.done:
                self.pos = len(self.text)  # vLLM's parser drops text after the calls
                return out
            at = self.text.find(CALL_OPEN, self.pos)
            if at == -1:
                if self.calls:  # whitespace between calls is not content
                    keep = len(self.text) if final else self.pos
                    self.pos = keep
                    return out
                # hold back what could still become "<tool_call>"
                hold = 0 if final else _partial_suffix(self.text, CALL_OPEN)
                return out + self._content(len(self.text) - hold)
            if not self.calls:
                before = self.text[self.pos:at]
                if before.strip():
                    out.append({"content": before.rstrip()})
            self.pos = at + len(CALL_OPEN)
            head = _AUTO_HEAD.match(self.text, self.pos)
            if not head:
                self.pos = at  # wait for the head to arrive
                if final and not self.calls:  # not a call this parser reads: it is text
                    out += self._content(len(self.text))
                return out
            out.append(self._start(json.loads(f'"{head.group(1)}"')))
            self.args_from, self.args_sent = head.end(), 0
            self.pos = head.end()


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of ``text`` that is a proper prefix of ``marker``."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0
