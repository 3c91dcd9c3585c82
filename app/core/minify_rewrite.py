"""Write the minified copy of a schema from its analysis and per-class alias maps.

Where enum values are aliased, the schema that lists them gets a legend in its
description (``"a" = "AWAITING_CUSTOMER_RESPONSE"``, in every ``describe`` mode): a model
shown the schema still knows what each value means."""
from __future__ import annotations

import json
from typing import Any

from app.core.minify_instance import minify_value
from app.core.minify_structure import (BRANCH_KW, EXTRA_KW, ITEM_KW, SINGLE_KW, Analysis,
                                       pointer_tokens)

INSTANCE_KW = ("default", "const")
INSTANCE_LIST_KW = ("examples", "enum")


class SchemaRewriter:
    def __init__(self, schema: Any, an: Analysis, aliases: dict[int, dict[str, str]],
                 nodes: dict[int, Any], options: Any) -> None:
        self.root = schema
        self.an = an
        self.aliases = aliases
        self.nodes = nodes
        self.options = options

    def alias_map(self, s: dict) -> dict[str, str]:
        v = self.an.var.get(id(s))
        return self.aliases.get(self.an.classes.find(v), {}) if v is not None else {}

    def rewrite(self, s: Any) -> Any:
        if isinstance(s, list):
            return [self.rewrite(x) for x in s]
        if not isinstance(s, dict) or id(s) not in self.an.var:
            return s
        amap = self.alias_map(s)
        out: dict[str, Any] = {}
        for kw, val in s.items():
            out[kw] = self._keyword(s, kw, val, amap)
        if "enum" in s or "const" in s:
            self._legend(s, out)
        return out

    def _legend(self, s: dict, out: dict) -> None:
        node = self.nodes.get(self.an.classes.find(self.an.var[id(s)]))
        vfwd = node.vfwd if node is not None else None
        if not vfwd:
            return
        listed = s.get("enum") if isinstance(s.get("enum"), list) else []
        listed = [*listed, s["const"]] if "const" in s else listed
        pairs = [f"{json.dumps(vfwd[v], ensure_ascii=False)} = {json.dumps(v, ensure_ascii=False)}"
                 for v in dict.fromkeys(x for x in listed if isinstance(x, str)) if v in vfwd]
        if not pairs:
            return
        desc = out.get("description")
        legend = "values: " + ", ".join(pairs)
        out["description"] = f"{desc} ({legend})" if isinstance(desc, str) and desc else legend

    def _keyword(self, s: dict, kw: str, val: Any, amap: dict[str, str]) -> Any:
        if kw == "properties" and isinstance(val, dict):
            return {amap.get(k, k): self._property(k, amap.get(k, k), p) for k, p in val.items()}
        if kw == "required" and isinstance(val, list):
            return [amap.get(k, k) if isinstance(k, str) else k for k in val]
        if kw == "dependentRequired" and isinstance(val, dict):
            return {amap.get(k, k): [amap.get(x, x) for x in v] if isinstance(v, list) else v
                    for k, v in val.items()}
        if kw == "dependencies" and isinstance(val, dict):
            return {amap.get(k, k): ([amap.get(x, x) for x in v] if isinstance(v, list)
                                     else self.rewrite(v)) for k, v in val.items()}
        if kw == "$ref" and isinstance(val, str):
            return self._ref(val)
        if kw in INSTANCE_KW or kw in INSTANCE_LIST_KW:
            return self._instance(s, kw, val)
        if kw in ("patternProperties", "$defs", "definitions", "dependentSchemas") and \
                isinstance(val, dict):
            return {k: self.rewrite(v) for k, v in val.items()}
        if kw in BRANCH_KW or kw in SINGLE_KW or kw in ITEM_KW or kw in EXTRA_KW or \
                kw in ("items", "prefixItems", "propertyNames"):
            return self.rewrite(val)
        return val

    def _property(self, key: str, alias: str, p: Any) -> Any:
        new = self.rewrite(p)
        if alias == key or self.options.describe != "prefix":
            return new
        if new is True:
            return {"description": key}
        if isinstance(new, dict):
            desc = new.get("description")
            new = dict(new)
            new["description"] = f"{key}: {desc}" if isinstance(desc, str) and desc else key
        return new

    def _instance(self, s: dict, kw: str, val: Any) -> Any:
        v = self.an.var.get(id(s))
        node = self.nodes.get(self.an.classes.find(v)) if v is not None else None
        if kw in INSTANCE_LIST_KW and isinstance(val, list):
            return [minify_value(x, node) for x in val]
        return minify_value(val, node)

    def _ref(self, ref: str) -> str:
        tokens = pointer_tokens(ref)
        if not tokens:
            return ref
        node: Any = self.root
        out: list[str] = []
        i = 0
        while i < len(tokens):
            tok = tokens[i]
            out.append(tok)
            if tok == "properties" and isinstance(node, dict) and i + 1 < len(tokens):
                props = node.get("properties")
                key = tokens[i + 1]
                out.append(self.alias_map(node).get(key, key))
                node = props.get(key) if isinstance(props, dict) else None
                i += 2
                continue
            if isinstance(node, dict):
                node = node.get(tok)
            elif isinstance(node, list) and tok.isdigit() and int(tok) < len(node):
                node = node[int(tok)]
            else:
                node = None
            i += 1
        return "#/" + "/".join(t.replace("~", "~0").replace("/", "~1") for t in out)
