"""Rename keys (and enum values at closed locations) of parsed JSON values along a key
map's location graph, both directions."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.core.minify_schema import KeyMap, Node


def _walks(v: Any, child: Node | None) -> bool:
    """Whether ``v`` under ``child`` can change (containers, or a string at a location
    whose enum values are aliased)."""
    t = type(v)
    return t is dict or t is list or (t is str and child is not None and child.vals is not None)


def minify_value(value: Any, node: Node | None) -> Any:
    """Original keys -> aliases, following the schema structure; unknown keys kept."""
    if node is None:
        return value
    if type(value) is dict:
        fwd = node.fwd
        out = {}
        for k, v in value.items():
            hit = fwd.get(k)
            if hit is not None:
                k, child = hit
            else:
                child = node.unknown_child(k)[0]
            out[k] = minify_value(v, child) if _walks(v, child) else v
        return out
    if type(value) is list:
        items = node.items
        if items is None:
            return value
        return [minify_value(v, items) if _walks(v, items) else v for v in value]
    if type(value) is str and node.vfwd is not None:
        return node.vfwd.get(value, value)
    return value


def expand_value(value: Any, node: Node | None, keymap: KeyMap,
                 problems: list[str] | None = None) -> Any:
    """Aliases -> original keys (and enum values). A key the location does not declare is
    kept unless it is an alias known elsewhere in the schema (then it is mapped, and
    noted in ``problems``): aliases never reach the client. A value is only ever mapped at
    its own closed enum location."""
    if type(value) is dict:
        emit = node.emit if node is not None else None
        out = {}
        for k, v in value.items():
            hit = emit.get(k) if emit is not None else None
            if hit is not None:
                k, _, child = hit
            else:
                k, child = _unknown_key(k, node, keymap, problems)
            out[k] = expand_value(v, child, keymap, problems) if _walks(v, child) else v
        return out
    if type(value) is list:
        items = node.items if node is not None else None
        return [expand_value(v, items, keymap, problems) if _walks(v, items) else v
                for v in value]
    if type(value) is str and node is not None and node.vals is not None:
        hit = node.vals.get(value)
        return hit[0] if hit is not None else value
    return value


def _unknown_key(key: str, node: Node | None, keymap: KeyMap,
                 problems: list[str] | None) -> tuple[str, Node | None]:
    if node is not None and key in node.fwd:  # the model wrote the original key
        return key, node.fwd[key][1]
    child, allowed = node.unknown_child(key) if node is not None else (None, False)
    if allowed:
        return key, child
    hit = keymap.fallback.get(key)
    if hit is not None:
        if problems is not None:
            where = node.path if node is not None else "an undeclared location"
            problems.append(f"alias {key!r} outside its location (at {where})")
        return hit[0], None
    return key, child
