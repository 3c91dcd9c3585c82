"""Streaming key re-expansion (S05): aliases -> original keys in a JSON text stream.

The expander tracks JSON structure (nesting, in-string state, escapes) and rewrites only
object keys, and string values at locations whose enum values are aliased; everything
else is passed through byte for byte, as soon as it arrives. Only the content of a key
(or aliased enum value) string that has not closed yet is held back. Output that is not JSON
or leaves the schema's structure is still expanded as far as possible; ``problems`` says
why the result is best effort (S98_ALERT_SCHEMA_ERR).
"""
from __future__ import annotations

import json
import re
from typing import Any

try:  # orjson is a dependency; without it every text takes the streaming scanner
    import orjson
except ImportError:  # pragma: no cover
    orjson = None

from app.core.minify_instance import expand_value
from app.core.minify_schema import KeyMap, Node

SCHEMA_ERR = "S98_ALERT_SCHEMA_ERR"

_OUT = re.compile(r'[{}\[\],"]')
_STR = re.compile(r'["\\]')


class StreamExpander:
    """``feed(chunk) -> str`` then ``close() -> str``; ``best_effort`` is true when the
    stream was malformed or left the schema (the text returned is still expanded)."""

    __slots__ = ("keymap", "problems", "_stack", "_mode", "_esc", "_key", "_expect_key",
                 "_offset", "_closed", "_vnode")

    def __init__(self, keymap: KeyMap) -> None:
        self.keymap = keymap
        self.problems: list[str] = []
        self._stack: list[list] = []  # [is_object, node, node_of_next_value]
        self._mode = 0  # 0: between tokens, 1: in a value string, 2: in a key string,
        #                 3: in a string value at an enum location (held like a key)
        self._esc = False
        self._key: list[str] = []
        self._expect_key = False
        self._offset = 0
        self._closed = False
        self._vnode: Node | None = None  # location of the enum value being held

    @property
    def best_effort(self) -> bool:
        return bool(self.problems)

    @property
    def holding(self) -> bool:
        """True while the content of an unfinished key or enum value is held back."""
        return self._mode >= 2

    def feed(self, chunk: str) -> str:
        if self._closed:
            raise ValueError("feed() after close()")
        out: list[str] = []
        i = 0
        start = 0  # chunk[start:i] is not yet emitted (or buffered, in a key)
        n = len(chunk)
        while i < n:
            if self._mode == 0:
                m = _OUT.search(chunk, i)
                if m is None:
                    break
                j = m.start()
                c = chunk[j]
                i = j + 1
                if c == '"':
                    if self._expect_key:
                        out.append(chunk[start:i])
                        start = i
                        self._mode = 2
                        self._expect_key = False
                    else:
                        node = self._value_node()
                        if node is not None and node.vals is not None:
                            out.append(chunk[start:i])
                            start = i
                            self._mode = 3
                            self._vnode = node
                        else:
                            self._mode = 1
                elif c == "{":
                    self._push(True)
                elif c == "[":
                    self._push(False)
                elif c == ",":
                    if self._stack and self._stack[-1][0]:
                        self._expect_key = True
                else:
                    self._pop(c, self._offset + j)
                continue
            if self._esc:  # the backslash ended the previous chunk
                self._esc = False
                i += 1
                continue
            m = _STR.search(chunk, i)
            if m is None:
                break
            j = m.start()
            if chunk[j] == "\\":
                if j + 1 < n:
                    i = j + 2
                else:
                    self._esc = True
                    i = n
                continue
            if self._mode >= 2:
                self._key.append(chunk[start:j])
                out.append(self._finish_key() if self._mode == 2 else self._finish_value())
                start = j
            self._mode = 0
            i = j + 1
        if self._mode >= 2:
            self._key.append(chunk[start:])
        else:
            out.append(chunk[start:])
        self._offset += n
        return "".join(out)

    def close(self) -> str:
        """Flush what is held back and record what was left unfinished."""
        if self._closed:
            return ""
        self._closed = True
        tail = ""
        if self._mode == 2:
            self.problems.append("stream ended inside an object key")
            tail = self._finish_key()
        elif self._mode == 3:
            self.problems.append("stream ended inside a string")
            tail = self._finish_value()
        elif self._mode == 1:
            self.problems.append("stream ended inside a string")
        if self._stack:
            self.problems.append(f"stream ended with {len(self._stack)} unclosed container(s)")
        return tail

    def _value_node(self) -> Node | None:
        if not self._stack:
            return self.keymap.root
        top = self._stack[-1]
        if top[0]:
            node, top[2] = top[2], None
            return node
        return top[1]

    def _push(self, is_object: bool) -> None:
        node = self._value_node()
        if is_object:
            self._stack.append([True, node, None])
            self._expect_key = True
        else:
            self._stack.append([False, node.items if node is not None else None, None])
            self._expect_key = False

    def _pop(self, closer: str, offset: int) -> None:
        if not self._stack:
            self.problems.append(f"unbalanced {closer!r} at offset {offset}")
            return
        frame = self._stack.pop()
        if frame[0] != (closer == "}"):
            self.problems.append(f"mismatched {closer!r} at offset {offset}")
        self._expect_key = False

    def _held(self, what: str) -> tuple[str, str | None]:
        """The held string's raw text and its decoded value (None: bad escape)."""
        raw = "".join(self._key)
        self._key = []
        if "\\" not in raw:
            return raw, raw
        try:
            return raw, json.loads('"' + raw + '"')
        except ValueError:
            self.problems.append(f"bad escape in {what} {raw!r}")
            return raw, None

    def _finish_value(self) -> str:
        raw, value = self._held("value")
        node = self._vnode
        hit = node.vals.get(value) if value is not None and node is not None else None
        return hit[1] if hit is not None else raw

    def _finish_key(self) -> str:
        raw, key = self._held("key")
        top = self._stack[-1]
        node: Node | None = top[1]
        if key is None:
            return raw
        hit = node.emit.get(key) if node is not None else None
        if hit is not None:
            top[2] = hit[2]
            return hit[1]
        text, top[2] = _unknown_key_text(key, raw, node, self.keymap, self.problems)
        return text


def _unknown_key_text(key: str, raw: str, node: Node | None, keymap: KeyMap,
                      problems: list[str]) -> tuple[str, Node | None]:
    if node is not None and key in node.fwd:  # the model wrote the original key
        return raw, node.fwd[key][1]
    child, allowed = node.unknown_child(key) if node is not None else (None, False)
    if allowed:
        return raw, child
    hit = keymap.fallback.get(key)
    if hit is not None:
        where = node.path if node is not None else "an undeclared location"
        problems.append(f"alias {key!r} outside its location (at {where})")
        return hit[1], None
    return raw, child


def expand_text(text: str, keymap: KeyMap) -> tuple[str, list[str]]:
    """Expand a whole response text, keeping its formatting; returns (text, problems).
    Text that parses as JSON takes a regex fast path over its strings and brackets;
    anything else goes through the streaming scanner (same output, and the problems)."""
    if orjson is not None:
        try:
            orjson.loads(text)
        except (orjson.JSONDecodeError, TypeError):
            pass
        else:
            return _expand_valid(text, keymap)
    ex = StreamExpander(keymap)
    out = ex.feed(text) + ex.close()
    return out, ex.problems


# In valid JSON every match is a whole string token (a key when a colon follows) or a
# bracket; commas, numbers, literals and whitespace are never matched.
_TOKENS = re.compile(r'"([^"\\]*(?:\\.[^"\\]*)*)"([ \t\n\r]*:)?|([{}\[\]])')


def _expand_valid(text: str, keymap: KeyMap) -> tuple[str, list[str]]:
    problems: list[str] = []
    parts: list[str] = []
    last = 0
    stack: list[list] = []  # [node of this object / of the array's items, is_object, child]

    def here() -> Node | None:
        """The node of a value starting at this point of the text."""
        if not stack:
            return keymap.root
        return stack[-1][2] if stack[-1][1] else stack[-1][0]

    for m in _TOKENS.finditer(text):
        raw = m.group(1)
        if raw is None:
            c = m.group(3)
            if c == "{" or c == "[":
                node = here()
                if c == "{":
                    stack.append([node, True, None])
                else:
                    stack.append([node.items if node is not None else None, False, None])
            else:
                stack.pop()
            continue
        if m.group(2) is not None:  # an object key
            top = stack[-1]
            node = top[0]
            key = json.loads('"' + raw + '"') if "\\" in raw else raw
            hit = node.emit.get(key) if node is not None else None
            if hit is not None:
                top[2] = hit[2]
                new = hit[1]
            else:
                new, top[2] = _unknown_key_text(key, raw, node, keymap, problems)
        else:  # a string value
            node = here()
            if node is None or node.vals is None:
                continue
            hit = node.vals.get(json.loads('"' + raw + '"') if "\\" in raw else raw)
            if hit is None:
                continue
            new = hit[1]
        if new != raw:
            parts.append(text[last:m.start(1)])
            parts.append(new)
            last = m.end(1)
    if not parts:
        return text, problems
    parts.append(text[last:])
    return "".join(parts), problems


def expand_json(obj_or_text: Any, keymap: KeyMap) -> Any:
    """Parsed value in -> expanded value out; text in -> expanded text out (formatting
    kept, malformed text expanded best effort; use ``expand_text`` to see problems)."""
    if isinstance(obj_or_text, str):
        return expand_text(obj_or_text, keymap)[0]
    return expand_value(obj_or_text, keymap.root, keymap)


def expand_tool_arguments(arguments: str, keymap: KeyMap) -> str:
    """A tool call's ``function.arguments`` JSON string, with the tool's parameter key map."""
    return expand_text(arguments, keymap)[0]


def validate_minified(output: Any, minified_schema: Any) -> list[str]:
    """Why ``output`` (text or parsed) does not parse or match the minified schema; [] if ok."""
    import jsonschema

    if isinstance(output, (str, bytes)):
        try:
            output = json.loads(output)
        except ValueError as exc:
            return [f"output is not JSON: {exc}"]
    cls = jsonschema.validators.validator_for(minified_schema)
    errors = sorted(cls(minified_schema).iter_errors(output), key=lambda e: list(e.path))
    return [f"{'/'.join(map(str, e.path)) or '$'}: {e.message}" for e in errors[:10]]


def best_effort_marker(problems: list[str]) -> dict[str, Any]:
    """What the gateway attaches to a response expanded best effort (header value / body
    extension field), so the client can tell it did not match the schema."""
    return {"code": SCHEMA_ERR, "best_effort": True, "problems": problems[:10]}
