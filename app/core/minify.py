"""Output-token diet: JSON schema key minification (S02) and re-expansion (S05).

One import for the gateway stages; the parts live in ``minify_schema`` (key map, cache),
``minify_alias`` (which alias each key gets), ``minify_structure`` (which schemas share a
location), ``minify_rewrite`` (the minified schema), ``minify_instance`` (parsed values),
``minify_stream`` (text streams, validation, S98 marker) and ``minify_messages``
(instructions).
"""
from __future__ import annotations

from typing import Any

from app.core.minify_instance import expand_value, minify_value
from app.core.minify_messages import legend_text, rewrite_messages, rewrite_text
from app.core.minify_schema import (ALIAS_STYLES, DEFAULT_CANDIDATES, KeyMap, MinifyOptions,
                                    Node, TokenCounter, clear_cache, minify_schema,
                                    schema_hash)
from app.core.minify_stream import (SCHEMA_ERR, StreamExpander, best_effort_marker,
                                    expand_json, expand_text, expand_tool_arguments,
                                    validate_minified)

__all__ = [
    "ALIAS_STYLES", "DEFAULT_CANDIDATES", "KeyMap", "MinifyOptions", "Node", "SCHEMA_ERR", "StreamExpander",
    "TokenCounter", "best_effort_marker", "clear_cache", "expand_json", "expand_text",
    "expand_tool_arguments", "expand_value", "legend_text", "minify_json",
    "minify_response_format", "minify_schema", "minify_tools", "minify_value",
    "rewrite_messages", "rewrite_text", "schema_hash", "validate_minified",
]


def minify_json(obj: Any, keymap: KeyMap) -> Any:
    """What a model following the minified schema would emit for ``obj``."""
    return minify_value(obj, keymap.root)


def minify_response_format(response_format: dict[str, Any], *,
                           tokenizer: TokenCounter | None = None,
                           options: MinifyOptions = MinifyOptions()
                           ) -> tuple[dict[str, Any], KeyMap] | None:
    """``{"type": "json_schema", "json_schema": {"name", "schema", ...}}`` -> minified copy
    and key map; None when there is nothing to minify (pass the request through)."""
    if not isinstance(response_format, dict) or response_format.get("type") != "json_schema":
        return None
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        return None
    minified, keymap = minify_schema(spec["schema"], tokenizer=tokenizer, options=options)
    if not keymap.changed:
        return None
    return {**response_format, "json_schema": {**spec, "schema": minified}}, keymap


def minify_tools(tools: list[dict[str, Any]], *, tokenizer: TokenCounter | None = None,
                 options: MinifyOptions = MinifyOptions()
                 ) -> tuple[list[dict[str, Any]], dict[str, KeyMap]]:
    """Minify each ``{"type": "function", "function": {"name", "parameters"}}``; returns the
    new tool list and ``{function name: key map}`` for tools that had keys (or enum
    values) renamed."""
    out: list[dict[str, Any]] = []
    maps: dict[str, KeyMap] = {}
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        params = fn.get("parameters") if isinstance(fn, dict) else None
        if not isinstance(params, dict) or not isinstance(fn.get("name"), str):
            out.append(tool)
            continue
        minified, keymap = minify_schema(params, tokenizer=tokenizer, options=options)
        if keymap.changed:
            maps[fn["name"]] = keymap
            tool = {**tool, "function": {**fn, "parameters": minified}}
        out.append(tool)
    return out, maps
