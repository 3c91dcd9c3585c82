"""JSON Schema key minification (S02): rename property keys to one-token aliases.

Aliases are assigned per *instance location*, not per schema object: every schema that can
apply at the same place of a JSON document (``anyOf``/``oneOf``/``allOf`` branches, ``$ref``
targets, ``if``/``then``/``else``) is unified into one class, and a class's keys share one
alias namespace. That makes the reverse map of each location a function, so the expander
(which cannot know which ``anyOf`` branch the model is writing) can walk the document by
structure. Two different locations may reuse the same aliases; nothing is global.

``patternProperties`` keys are never renamed (the model invents them); aliases are chosen
so they never match a pattern of their location. Their value schemas are still walked.

With ``MinifyOptions(minify_enums=True)`` string values of ``enum``/``const`` get one-token
aliases too, but only at *closed* locations (every schema there lists its values; see
``Analysis.class_enums``), so a string written there can only be an alias; strings at any
other location are never touched.
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from app.core.minify_alias import (ALIAS_STYLES, DEFAULT_CANDIDATES,  # noqa: F401 (re-export)
                                   TokenCounter, assign_aliases)
from app.core.minify_structure import EXTRA_KW, Analysis

try:  # orjson is a dependency; json is the fallback for exotic values (big ints)
    import orjson
except ImportError:  # pragma: no cover
    orjson = None


class Node:
    """What the expander knows about one instance location.

    ``emit`` maps a key as the model writes it (alias, or an original key kept verbatim) to
    ``(original_key, original_key_json, child_node)``; ``fwd`` maps original -> alias.
    ``vals`` maps an enum value alias to ``(original_value, original_value_json)`` and
    ``vfwd`` original -> alias; both None unless string values here are minified.
    """

    __slots__ = ("emit", "fwd", "items", "extra", "patterns", "path", "vals", "vfwd", "open")

    def __init__(self, path: str) -> None:
        self.emit: dict[str, tuple[str, str, Node | None]] = {}
        self.fwd: dict[str, tuple[str, Node | None]] = {}
        self.items: Node | None = None
        self.extra: Node | None = None
        self.patterns: tuple[tuple[re.Pattern, Node | None], ...] = ()
        self.path = path
        self.vals: dict[str, tuple[str, str]] | None = None
        self.vfwd: dict[str, str] | None = None
        # Any key is the client's own here (``additionalProperties: true``, or an object
        # that declares no properties and does not forbid extra ones): keep it verbatim,
        # even when it is spelt like an alias of another location.
        self.open = False

    def unknown_child(self, key: str) -> tuple[Node | None, bool]:
        """Child for a key this location does not declare, and whether the schema allows
        it explicitly (pattern match, an ``additionalProperties`` schema, an open object)."""
        for pattern, child in self.patterns:
            if pattern.search(key):
                return child, True
        if self.extra is not None:
            return self.extra, True
        return None, self.open


@dataclass(frozen=True)
class KeyMap:
    root: Node
    tokenizer: str
    schema_hash: str
    renames: tuple[tuple[str, str, str], ...]  # (location path, original, alias)
    fallback: dict[str, tuple[str, str]] = field(repr=False)  # alias -> (original, json)
    ambiguous: frozenset[str] = frozenset()  # aliases that mean different keys somewhere
    word_map: dict[str, str] = field(default_factory=dict, repr=False)
    value_renames: tuple[tuple[str, str, str], ...] = ()  # (location path, value, alias)

    @property
    def renamed(self) -> int:
        return len(self.renames)

    @property
    def changed(self) -> bool:
        """Whether the minified schema differs from the original in keys or values."""
        return bool(self.renames or self.value_renames)

    def alias_of(self, path: str, original: str) -> str | None:
        for p, o, a in self.renames:
            if p == path and o == original:
                return a
        return None

def _compile(pattern: str) -> re.Pattern | None:
    try:
        return re.compile(pattern)
    except re.error:
        return None


def _json_key(key: str) -> str:
    text = json.dumps(key, ensure_ascii=False)[1:-1]
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogate: keep it escaped
        return json.dumps(key)[1:-1]
    return text


# --------------------------------------------------------------------------- public API

@dataclass(frozen=True)
class MinifyOptions:
    describe: str = "prefix"  # "prefix": description = "original_key: <description>"; "keep"
    keep_short: bool = True  # keys already one token stay verbatim
    minify_enums: bool = False  # also alias multi-token enum/const strings at closed locations
    # key aliases: "letters" or "semantic" (minify_alias); the gateway takes the policy's
    # minify_alias_style (default semantic), plain calls keep letters
    alias_style: str = "letters"

    def __post_init__(self) -> None:
        if self.alias_style not in ALIAS_STYLES:
            raise ValueError(f"alias_style must be one of {ALIAS_STYLES}, "
                             f"not {self.alias_style!r}")

    def tag(self) -> str:
        return (f"{self.describe}:{int(self.keep_short)}:{int(self.minify_enums)}:"
                f"{self.alias_style}")


def schema_hash(schema: Any) -> str:
    """sha256 of the schema as serialised (key order included: it fixes alias order)."""
    return hashlib.sha256(_dumps(schema)).hexdigest()


def _dumps(obj: Any) -> bytes:
    if orjson is not None:
        try:
            return orjson.dumps(obj)
        except TypeError:
            pass
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8",
                                                                           "surrogatepass")


def _copy(obj: Any) -> Any:
    if orjson is not None:
        try:
            return orjson.loads(orjson.dumps(obj))
        except (TypeError, orjson.JSONDecodeError):
            pass
    return json.loads(json.dumps(obj))


_CACHE_SIZE = 512
_cache: OrderedDict[tuple, tuple[Any, KeyMap]] = OrderedDict()
_cache_lock = threading.Lock()


def minify_schema(schema: Any, *, tokenizer: TokenCounter | None = None,
                  options: MinifyOptions = MinifyOptions()) -> tuple[Any, KeyMap]:
    """Return ``(minified_schema, keymap)``; the schema returned is a fresh copy the
    caller may mutate. Cached (LRU) by schema hash, tokenizer name and options."""
    digest = schema_hash(schema)
    key = (digest, tokenizer.name if tokenizer is not None else "", options.tag())
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return _copy(hit[0]), hit[1]
    # Analyse a fresh copy: the analysis keys schemas by identity, so a dict shared by two
    # places (built in Python) would tie them together; the map must depend on the JSON
    # alone, as the cache key does.
    minified, keymap = _build(_copy(schema), tokenizer, options, digest)
    with _cache_lock:
        _cache[key] = (minified, keymap)
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return _copy(minified), keymap


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()


def _build(schema: Any, counter: TokenCounter | None, options: MinifyOptions,
           digest: str) -> tuple[Any, KeyMap]:
    an = Analysis(schema)
    cls = an.classes
    keys = an.class_keys()
    pats = an.class_patterns()
    aliases: dict[int, dict[str, str]] = {}
    compiled: dict[int, list[tuple[str, re.Pattern]]] = {}
    for c in set(keys) | set(pats):
        compiled[c] = [(p, r) for p in pats.get(c, ()) if (r := _compile(p)) is not None]
        aliases[c] = assign_aliases(keys.get(c, []), [r for _, r in compiled[c]], counter,
                                    options.alias_style)

    nodes, renames, seen_alias, ambiguous = _node_graph(an, aliases, compiled)
    value_renames = (_value_aliases(an, nodes, counter, options.alias_style)
                     if options.minify_enums else [])
    root = nodes[cls.find(an.var[id(schema)])] if isinstance(schema, dict) else Node("$")
    # Mentions of enum values in the instructions stay as written: rewriting them to their
    # aliases was measured and cost 4 fields right of 50 (26 -> 22, minify_quality.txt)
    word_map = _word_map(renames)
    keymap = KeyMap(root=root, tokenizer=counter.name if counter is not None else "",
                    schema_hash=digest, renames=tuple(renames), fallback=seen_alias,
                    ambiguous=frozenset(ambiguous), word_map=word_map,
                    value_renames=tuple(value_renames))
    from app.core.minify_rewrite import SchemaRewriter
    rewriter = SchemaRewriter(schema, an, aliases, nodes, options)
    return rewriter.rewrite(schema), keymap


def _node_graph(an: Analysis, aliases: dict[int, dict[str, str]],
                compiled: dict[int, list[tuple[str, re.Pattern]]]):
    """One Node per location class, linked like the classes; plus the renames, the
    alias -> original fallback (first seen) and the aliases that mean different keys."""
    cls = an.classes
    nodes: dict[int, Node] = {}
    class_path: dict[int, str] = {}
    for s in an.order:
        class_path.setdefault(cls.find(an.var[id(s)]), an.path[id(s)])

    def node_of(c: int) -> Node:
        c = cls.find(c)
        if c not in nodes:
            nodes[c] = Node(class_path.get(c, "$"))
        return nodes[c]

    renames: list[tuple[str, str, str]] = []
    seen_alias: dict[str, tuple[str, str]] = {}
    ambiguous: set[str] = set()
    open_classes = _open_classes(an)
    for c in sorted({cls.find(v) for v in an.var.values()}):
        node = node_of(c)
        labels = cls.labels[c]
        for k, a in aliases.get(c, {}).items():
            child_c = labels.get(("p", k))
            child = node_of(child_c) if child_c is not None else None
            node.emit[a] = (k, _json_key(k), child)
            node.fwd[k] = (a, child)
            if a != k:
                renames.append((node.path, k, a))
                prev = seen_alias.setdefault(a, (k, _json_key(k)))
                if prev[0] != k:
                    ambiguous.add(a)
        if "i" in labels:
            node.items = node_of(labels["i"])
        if "x" in labels:
            node.extra = node_of(labels["x"])
        node.open = c in open_classes
        node.patterns = tuple((r, node_of(labels[("pp", p)]) if ("pp", p) in labels else None)
                              for p, r in compiled.get(c, ()))

    return nodes, renames, seen_alias, ambiguous


def _open_classes(an: Analysis) -> set[int]:
    """Location classes where any key is the client's: one of their schemas says
    ``additionalProperties: true``, or none declares properties (a free-form object) and
    none forbids extra ones."""
    declared: set[int] = set()
    forbids: set[int] = set()
    allows: set[int] = set()
    seen: set[int] = set()
    for sch in an.order:
        c = an.classes.find(an.var[id(sch)])
        seen.add(c)
        if isinstance(sch.get("properties"), dict) and sch["properties"]:
            declared.add(c)
        if any(sch.get(kw) is False for kw in EXTRA_KW):
            forbids.add(c)
        if any(sch.get(kw) is True for kw in EXTRA_KW):
            allows.add(c)
    return allows | (seen - declared - forbids)


def _value_aliases(an: Analysis, nodes: dict[int, Node], counter: TokenCounter | None,
                   style: str = "letters") -> list[tuple[str, str, str]]:
    """Give the multi-token enum strings of every closed class a one-token alias (not one
    of that class's values) on its node, a word of the value with ``style`` "semantic";
    returns (path, value, alias) per renamed value."""
    out: list[tuple[str, str, str]] = []
    for c, values in sorted(an.class_enums().items()):
        node = nodes.get(c)
        if node is None:
            continue
        amap = {v: a for v, a in assign_aliases(values, [], counter, style,
                                                for_values=True).items() if a != v}
        if not amap:
            continue
        node.vfwd = amap
        node.vals = {a: (v, _json_key(v)) for v, a in amap.items()}
        out += [(node.path, v, a) for v, a in amap.items()]
    return out


def _word_map(renames: list[tuple[str, str, str]]) -> dict[str, str]:
    """original -> alias for originals that got the same alias everywhere."""
    seen: dict[str, set[str]] = {}
    for _, orig, alias in renames:
        seen.setdefault(orig, set()).add(alias)
    return {o: next(iter(a)) for o, a in seen.items() if len(a) == 1}
