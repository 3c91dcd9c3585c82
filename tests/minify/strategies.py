"""Hypothesis strategies: random JSON schemas (objects, arrays of objects, $defs/$ref,
anyOf, oneOf with a const discriminator, enums, enums mixed with free strings) together
with a way to draw valid instances of them. Keys include verbose keys built from a few
shared words (so semantic aliases collide among siblings, and a key may equal a word that
is another key's best alias)."""
from __future__ import annotations

from hypothesis import strategies as st

ALIAS_LIKE = ["a", "b", "c", "A", "aa", "id", "_c1"]
KEY_ALPHABET = st.characters(blacklist_categories=("Cs",), min_codepoint=1)
WORDS = ["customer", "email", "name", "total", "amount", "extracted", "value", "department",
         "organization", "of", "id", "a", "contact", "Customer", "2", "é"]


@st.composite
def word_keys(draw):
    """snake_case, kebab-case, camelCase or spaced keys from a small shared vocabulary."""
    words = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=4))
    style = draw(st.sampled_from(["_", "-", " ", "camel"]))
    if style == "camel":
        return words[0] + "".join(w[:1].upper() + w[1:] for w in words[1:])
    return style.join(words)


keys = st.one_of(
    st.sampled_from(ALIAS_LIKE + ["name", "customer_full_name", "extracted_invoice_total",
                                  "line_items", "key with space", 'quo"te', "back\\slash",
                                  "unicodé_clé", "emoji_😀_key", "tab\tkey", "\u2028sep",
                                  "customer", "email", "total"]),
    word_keys(),
    st.text(KEY_ALPHABET, min_size=1, max_size=12),
)
string_values = st.one_of(
    st.sampled_from(ALIAS_LIKE + ['{"a":1}', '"a":', "\\", '"', "😀", "\u0000", "a\\u0062",
                                  "customer", "email", "total", '{"customer":1}']),
    st.text(KEY_ALPHABET, max_size=20),
)
enum_values = st.one_of(
    st.sampled_from(ALIAS_LIKE + ["AWAITING_CUSTOMER_RESPONSE", "Closed Won", "sales_qualified",
                                  'quo"te', "back\\slash", "😀 émoji", "\u2028", "a\\u0062", "",
                                  "customer", "total"]),
    st.text(KEY_ALPHABET, max_size=12),
)
SCALARS = [{"type": "string"}, {"type": "integer"}, {"type": "boolean"}, {"type": "null"},
           {"type": "number"}]


@st.composite
def object_schema(draw, depth: int, defs: list[str]):
    names = draw(st.lists(keys, min_size=1, max_size=6, unique=True))
    props = {k: draw(value_schema(depth - 1, defs)) for k in names}
    required = [k for k in names if draw(st.booleans())]
    schema = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        schema["required"] = required
    if draw(st.booleans()):
        schema["description"] = draw(st.text(max_size=10))
    return schema


@st.composite
def value_schema(draw, depth: int, defs: list[str]):
    options = ["scalar"]
    if depth > 0:
        options += ["object", "array", "anyof"]
    if defs:
        options.append("ref")
    options += ["enum", "const", "open_enum"]
    if depth > 0:
        options.append("oneof")
    kind = draw(st.sampled_from(options))
    if kind == "scalar":
        return dict(draw(st.sampled_from(SCALARS)))
    if kind in ("enum", "open_enum"):
        values = draw(st.lists(enum_values, min_size=1, max_size=5, unique=True))
        if draw(st.booleans()):
            values.append(draw(st.sampled_from([None, 7, True])))
        enum = {"enum": values}
        if kind == "open_enum":  # a free string may sit where enum values do
            return {"anyOf": [enum, {"type": "string"}]}
        return enum
    if kind == "const":
        return {"const": draw(enum_values)}
    if kind == "oneof":
        return draw(one_of_schema(depth - 1, defs))
    if kind == "object":
        return draw(object_schema(depth, defs))
    if kind == "array":
        return {"type": "array", "items": draw(value_schema(depth - 1, defs)), "maxItems": 3}
    if kind == "ref":
        return {"$ref": f"#/$defs/{draw(st.sampled_from(defs))}"}
    return {"anyOf": [draw(object_schema(depth - 1, defs)), draw(object_schema(depth - 1, defs))]}


@st.composite
def one_of_schema(draw, depth: int, defs: list[str]):
    """Object branches told apart by a required discriminator with distinct consts (so
    exactly one branch matches)."""
    tag = draw(keys)
    tags = draw(st.lists(enum_values, min_size=2, max_size=3, unique=True))
    branches = []
    for value in tags:
        branch = draw(object_schema(depth, defs))
        branch["properties"][tag] = {"const": value}
        branch["required"] = sorted(set(branch.get("required", [])) | {tag})
        branches.append(branch)
    return {"oneOf": branches}


@st.composite
def schemas(draw):
    n_defs = draw(st.integers(0, 2))
    defs = {f"d{i}": draw(object_schema(1, [])) for i in range(n_defs)}
    root = draw(object_schema(3, list(defs)))
    if defs:
        root["$defs"] = defs
    return root


def _resolve(root: dict, schema: dict) -> dict:
    while "$ref" in schema:
        schema = root["$defs"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


@st.composite
def instance(draw, root: dict, schema: dict | None = None):
    schema = _resolve(root, root if schema is None else schema)
    for kw in ("anyOf", "oneOf"):
        if kw in schema:
            return draw(instance(root, draw(st.sampled_from(schema[kw]))))
    if "enum" in schema:
        return draw(st.sampled_from(schema["enum"]))
    if "const" in schema:
        return schema["const"]
    kind = schema["type"]
    if kind == "object":
        out = {}
        required = set(schema.get("required", []))
        for k, sub in schema["properties"].items():
            if k in required or draw(st.booleans()):
                out[k] = draw(instance(root, sub))
        return out
    if kind == "array":
        return draw(st.lists(instance(root, schema["items"]), max_size=3))
    return draw({"string": string_values, "integer": st.integers(-10**6, 10**6),
                 "boolean": st.booleans(), "null": st.none(),
                 "number": st.floats(allow_nan=False, allow_infinity=False, width=32)}[kind])


def chunked(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in zip(points, points[1:])]
