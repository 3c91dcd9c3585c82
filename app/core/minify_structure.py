"""Schema structure for minification: which schemas apply at the same instance location.

Every schema that can apply at one place of a JSON document (``anyOf``/``oneOf``/``allOf``
branches, ``$ref`` targets, ``if``/``then``/``else``, ``not``, dependent schemas) is unified
into one class; children with the same label (property key, array items, additional
properties, pattern) of unified classes are unified too (congruence closure).
"""
from __future__ import annotations

from typing import Any, Iterator
from urllib.parse import unquote

SINGLE_KW = ("not", "if", "then", "else")
BRANCH_KW = ("anyOf", "oneOf", "allOf")
ITEM_KW = ("additionalItems", "contains", "unevaluatedItems")
EXTRA_KW = ("additionalProperties", "unevaluatedProperties")
# A schema with one of these is not treated as enum-closed (an alias could break them).
STRING_CONSTRAINTS = ("pattern", "minLength", "maxLength", "format", "contentEncoding",
                      "contentMediaType")
WRAPPER_KW = ("$ref", "anyOf", "oneOf", "allOf")

class Classes:
    """Union-find over instance locations with labelled children (congruence closure):
    unifying two locations unifies their same-labelled children too."""

    def __init__(self) -> None:
        self.parent: list[int] = []
        self.labels: list[dict[Any, int]] = []

    def new(self) -> int:
        self.parent.append(len(self.parent))
        self.labels.append({})
        return len(self.parent) - 1

    def find(self, x: int) -> int:
        root = x
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[x] != root:
            self.parent[x], x = root, self.parent[x]
        return root

    def union(self, a: int, b: int) -> None:
        work = [(a, b)]
        while work:
            a, b = work.pop()
            a, b = self.find(a), self.find(b)
            if a == b:
                continue
            if b < a:
                a, b = b, a
            self.parent[b] = a
            mine = self.labels[a]
            for label, child in self.labels[b].items():
                if label in mine:
                    work.append((mine[label], child))
                else:
                    mine[label] = child
            self.labels[b] = {}

    def link(self, parent: int, label: Any, child: int) -> None:
        labels = self.labels[self.find(parent)]
        if label in labels:
            self.union(labels[label], child)
        else:
            labels[label] = child


def pointer_tokens(ref: str) -> list[str] | None:
    if not ref.startswith("#"):
        return None
    frag = unquote(ref[1:])
    if frag == "":
        return []
    if not frag.startswith("/"):
        return None  # $anchor references are not resolved
    return [t.replace("~1", "/").replace("~0", "~") for t in frag[1:].split("/")]


def resolve(root: Any, ref: str) -> Any:
    tokens = pointer_tokens(ref)
    if tokens is None:
        return None
    node = root
    for tok in tokens:
        if isinstance(node, dict) and tok in node:
            node = node[tok]
        elif isinstance(node, list) and tok.isdigit() and int(tok) < len(node):
            node = node[int(tok)]
        else:
            return None
    return node


def _subschemas(s: dict) -> Iterator[tuple[str, Any, Any]]:
    """(relation, label, subschema) for every subschema of ``s``: relation is "same"
    (applies at this location), "child" (at a labelled child location) or "root"."""
    for kw in BRANCH_KW:
        branches = s.get(kw)
        if isinstance(branches, list):
            for b in branches:
                yield "same", None, b
    for kw in SINGLE_KW:
        if kw in s:
            yield "same", None, s[kw]
    for kw in ("dependentSchemas", "dependencies"):
        if isinstance(s.get(kw), dict):
            for v in s[kw].values():
                if isinstance(v, dict):
                    yield "same", None, v
    props = s.get("properties")
    if isinstance(props, dict):
        for k, p in props.items():
            yield "child", ("p", k), p
    pats = s.get("patternProperties")
    if isinstance(pats, dict):
        for pat, p in pats.items():
            yield "child", ("pp", pat), p
    items = s.get("items")
    if isinstance(items, list):
        for it in items:
            yield "child", "i", it
    elif items is not None:
        yield "child", "i", items
    if isinstance(s.get("prefixItems"), list):
        for it in s["prefixItems"]:
            yield "child", "i", it
    for kw in ITEM_KW:
        if kw in s:
            yield "child", "i", s[kw]
    for kw in EXTRA_KW:
        if kw in s:
            yield "child", "x", s[kw]
    for kw in ("$defs", "definitions"):
        if isinstance(s.get(kw), dict):
            for v in s[kw].values():
                yield "root", None, v


class Analysis:
    def __init__(self, schema: Any) -> None:
        self.schema = schema
        self.classes = Classes()
        self.var: dict[int, int] = {}
        self.order: list[dict] = []  # schema dicts in first-visit order
        self.path: dict[int, str] = {}
        self._walk()

    def var_of(self, s: dict, path: str) -> int:
        key = id(s)
        if key not in self.var:
            self.var[key] = self.classes.new()
            self.path[key] = path
        return self.var[key]

    def _walk(self) -> None:
        if not isinstance(self.schema, dict):
            return
        self.var_of(self.schema, "$")
        stack = [self.schema]
        seen: set[int] = set()
        while stack:
            s = stack.pop()
            if id(s) in seen:
                continue
            seen.add(id(s))
            self.order.append(s)
            c = self.var[id(s)]
            path = self.path[id(s)]
            ref = s.get("$ref")
            if isinstance(ref, str):
                target = resolve(self.schema, ref)
                if isinstance(target, dict):
                    self.classes.union(c, self.var_of(target, path))
                    stack.append(target)
            subs = list(_subschemas(s))
            for relation, label, sub in reversed(subs):
                if not isinstance(sub, dict):
                    continue
                if relation == "same":
                    self.classes.union(c, self.var_of(sub, path))
                elif relation == "child":
                    sub_path = f"{path}.{label[1]}" if isinstance(label, tuple) else (
                        f"{path}[]" if label == "i" else f"{path}.*")
                    self.classes.link(c, label, self.var_of(sub, sub_path))
                else:
                    self.var_of(sub, "$")
                stack.append(sub)

    def class_keys(self) -> dict[int, list[str]]:
        keys: dict[int, list[str]] = {}
        for s in self.order:
            c = self.classes.find(self.var[id(s)])
            bucket = keys.setdefault(c, [])
            props = s.get("properties")
            if isinstance(props, dict):
                for k in props:
                    if k not in bucket:
                        bucket.append(k)
        return keys

    def class_patterns(self) -> dict[int, list[str]]:
        pats: dict[int, list[str]] = {}
        for s in self.order:
            pp = s.get("patternProperties")
            if isinstance(pp, dict):
                c = self.classes.find(self.var[id(s)])
                pats.setdefault(c, []).extend(p for p in pp if p not in pats.get(c, ()))
        return pats

    def class_enums(self) -> dict[int, list[str]]:
        """Strings of ``enum``/``const`` per *closed* class: one where every schema that
        applies restricts the instance to listed values (or is a wrapper whose branches
        do). At such a location a string the model writes can only be one of those
        values, so an alias there is unambiguous. Classes with any schema that admits a
        free string (``{"type": "string"}``, ``{}``, a ``true`` branch, an unresolvable
        ``$ref``, string constraints an alias could break) are left out."""
        members: dict[int, list[str]] = {}
        open_: set[int] = set()
        for s in self.order:
            c = self.classes.find(self.var[id(s)])
            if c in open_:
                continue
            if not self._closed(s):
                open_.add(c)
                continue
            bucket = members.setdefault(c, [])
            values = s["enum"] if isinstance(s.get("enum"), list) else []
            if "const" in s:
                values = [*values, s["const"]]
            for v in values:
                if isinstance(v, str) and v not in bucket:
                    bucket.append(v)
        return {c: v for c, v in members.items() if v and c not in open_}

    def _closed(self, s: dict) -> bool:
        if any(k in s for k in STRING_CONSTRAINTS):
            return False
        for kw in BRANCH_KW:
            if any(not isinstance(b, dict) for b in s.get(kw) or ()):
                return False
        ref = s.get("$ref")
        if ref is not None and not isinstance(resolve(self.schema, ref)
                                              if isinstance(ref, str) else None, dict):
            return False
        if "enum" in s:
            return isinstance(s["enum"], list)
        return "const" in s or any(k in s for k in WRAPPER_KW)
