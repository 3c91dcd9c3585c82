"""Compact JSON: separators are output tokens too.

A grammar-constrained engine writes JSON with the separators its grammar allows.
xgrammar's JSON-schema grammar (vLLM's default backend, and the reference engine's)
writes ``", "`` and ``": "`` when whitespace is fixed (vLLM's ``disable_any_whitespace``),
and lets the model add any whitespace otherwise; on the minify corpus those spaces are
13% of the output tokens (bench/results/minify.txt). S02 can instead hand a pool tier the
minified schema as an EBNF grammar with ``","`` and ``":"`` (vLLM's per-request
``structured_outputs.grammar``), so the engine cannot spend tokens on them.

``compact_grammar`` builds that grammar (xgrammar's own JSON-schema conversion, with the
separators changed; cached per schema). ``respace`` rewrites compact JSON text with the
separators the engine would have used, for the ledger's raw-equivalent token count.

The grammar fixes the characters, not the tokens: a model trained mostly on spaced JSON
writes ``":"`` as ``'":'`` + ``'"'`` (two tokens where the tokenizer has one), so under
the grammar alone compact output costs about what spaced output did. ``with_style_hint``
adds one line to the instructions that shows the style (a made-up object, nothing the
model could copy into an answer); on SmolLM2 (30 e-mails) that cut the tokens it generates
by 8.5% against the compact grammar alone, still 14% above the canonical count, and got
more fields right (bench/results/minify_quality.txt). Policy ``minify_style_hint``.
All are pure functions.
"""
from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

DEFAULT_SEPARATORS = (", ", ": ")   # xgrammar's, when whitespace is not free
COMPACT_SEPARATORS = (",", ":")


@lru_cache(maxsize=512)
def _grammar(schema_json: str) -> str | None:
    try:
        import xgrammar as xgr
    except ImportError:  # a gateway installed without the [ml] extra keeps json_schema
        return None
    try:
        grammar = xgr.Grammar.from_json_schema(schema_json, any_whitespace=False,
                                               separators=COMPACT_SEPARATORS)
    except Exception:  # noqa: BLE001 - a schema xgrammar cannot convert stays json_schema
        return None
    return str(grammar)


def warm() -> None:
    """Import xgrammar (about 2 s, it brings torch) before the first request needs it."""
    _grammar('{"type": "object"}')


def compact_grammar(schema: dict[str, Any]) -> str | None:
    """EBNF (xgrammar dialect, which vLLM's xgrammar backend parses) for JSON valid under
    ``schema`` written with compact separators; None when it cannot be built."""
    # key order matters: xgrammar writes properties in the schema's order
    return _grammar(json.dumps(schema, ensure_ascii=False))


STYLE_HINT = 'Example of the answer style: {"id":"X1","status":"open","ok":true}'


def with_style_hint(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A new message list with ``STYLE_HINT`` on a line of its own at the end of the first
    system (or developer) message, or in a new system message in front. The line is the
    same on every request, so the prompt prefix stays cacheable."""
    out = list(messages)
    for i, msg in enumerate(out):
        if not isinstance(msg, dict) or msg.get("role") not in ("system", "developer"):
            continue
        content = msg.get("content")
        if isinstance(content, str):
            out[i] = {**msg, "content": f"{content}\n{STYLE_HINT}" if content else STYLE_HINT}
            return out
        if isinstance(content, list):
            out[i] = {**msg, "content": [*content, {"type": "text", "text": "\n" + STYLE_HINT}]}
            return out
        break
    return [{"role": "system", "content": STYLE_HINT}, *out]


def respace(text: str, separators: tuple[str, str] = DEFAULT_SEPARATORS) -> str:
    """``text`` with every structural ``,`` and ``:`` (outside strings) followed by the
    separators' whitespace unless whitespace already follows. Strings, escapes and
    everything else are kept byte for byte; text that is not JSON is handled the same
    way, lexically."""
    comma, colon = separators
    after = {",": comma[1:], ":": colon[1:]}
    out: list[str] = []
    in_string = escaped = False
    n = len(text)
    start = 0
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"':
            in_string = True
        elif ch in after and after[ch] and (i + 1 >= n or text[i + 1] not in " \t\r\n"):
            out.append(text[start:i + 1])
            out.append(after[ch])
            start = i + 1
    out.append(text[start:])
    return "".join(out)
