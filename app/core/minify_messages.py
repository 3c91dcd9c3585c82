"""Rewrite mentions of schema keys in chat instructions to their aliases.

Only whole words are replaced (``customer_name`` never matches inside ``customer_name_2``
or ``my_customer_name``). An original key is rewritten only if it got the same alias at
every location (otherwise the mention is ambiguous and is left; the alias's description
still names it). Identifier-like keys (with ``_``, a digit or an inner capital) are
replaced wherever they occur; plain words such as ``name`` or ``status`` only when quoted
(``"name"``, ``'name'``, `` `name` ``), so prose like "the name of the customer" survives.
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from app.core.minify_schema import KeyMap

_REWRITE_ROLES = frozenset({"system", "developer", "user", "assistant"})
_IDENT = re.compile(r"[_0-9]|[a-z][A-Z]")
_W = r"[0-9A-Za-z_]"


def is_identifier_like(key: str) -> bool:
    return bool(_IDENT.search(key))


@lru_cache(maxsize=256)
def _pattern(items: tuple[tuple[str, str], ...]) -> re.Pattern | None:
    bare = sorted((k for k, _ in items if is_identifier_like(k)), key=len, reverse=True)
    quoted = sorted((k for k, _ in items if not is_identifier_like(k)), key=len, reverse=True)
    parts = []
    if bare:
        parts.append(rf"(?<!{_W})(?P<bare>{'|'.join(map(re.escape, bare))})(?!{_W})")
    if quoted:
        alt = "|".join(map(re.escape, quoted))
        parts.append(rf"(?P<q>[\"'`])(?P<word>{alt})(?P=q)")
    return re.compile("|".join(parts)) if parts else None


def rewrite_text(text: str, keymap: KeyMap) -> str:
    pattern = _pattern(tuple(sorted(keymap.word_map.items())))
    if pattern is None:
        return text
    words = keymap.word_map
    has_bare = "bare" in pattern.groupindex

    def sub(m: re.Match) -> str:
        if has_bare and m.group("bare") is not None:
            return words[m.group("bare")]
        return m.group("q") + words[m.group("word")] + m.group("q")

    return pattern.sub(sub, text)


def rewrite_messages(messages: list[dict[str, Any]], keymap: KeyMap) -> list[dict[str, Any]]:
    """A new message list (inputs untouched) with key mentions replaced in the text of
    system/developer/user/assistant messages (string content or ``text`` parts)."""
    out = []
    for msg in messages:
        if msg.get("role") not in _REWRITE_ROLES:
            out.append(msg)
            continue
        content = msg.get("content")
        if isinstance(content, str):
            msg = {**msg, "content": rewrite_text(content, keymap)}
        elif isinstance(content, list):
            msg = {**msg, "content": [
                {**part, "text": rewrite_text(part["text"], keymap)}
                if isinstance(part, dict) and part.get("type") == "text"
                and isinstance(part.get("text"), str) else part
                for part in content]}
        out.append(msg)
    return out


def _where(path: str) -> str:
    return path[2:] if path.startswith("$.") else path


def legend_text(keymap: KeyMap) -> str:
    """One instruction line per location saying what each alias stands for, for
    upstreams that enforce the schema as a grammar without showing it to the model
    (vLLM, the reference engine): descriptions in the schema never reach those models."""
    by_path: dict[str, list[str]] = {}
    for path, orig, alias in keymap.renames:
        by_path.setdefault(path, []).append(f"{alias} = {orig}")
    lines = []
    for path, pairs in by_path.items():
        where = "" if path in ("", "$") else f" inside {_where(path)}"
        lines.append(f"Answer keys{where}: {'; '.join(pairs)}.")
    values: dict[str, list[str]] = {}
    for path, value, alias in keymap.value_renames:
        values.setdefault(path, []).append(f'"{alias}" = "{value}"')
    for path, pairs in values.items():
        lines.append(f"Values of {_where(path)}: {'; '.join(pairs)}.")
    return "\n".join(lines)
