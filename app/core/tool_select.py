"""Tool-definition retrieval: which of a request's tools to send. Pure.

An agent that declares 50 tools pays for 50 schemas on every turn although a turn uses
one or two. When a request carries more than ``k`` tools, the tools sent are:

- every tool the request cannot do without: the one ``tool_choice`` names, every tool
  called earlier in the conversation, and the tenant's pinned tools (never dropped, even
  past ``k``);
- then the best scored, at least ``k`` and up to ``k_max``: past ``k`` only those within
  ``margin`` of the best (a request that matches several tools alike gets them all), and
  more (``k_low``) on a first turn whose best score is low (a confidence rule). The
  score is the best cosine of the conversation's user turns to any one field of the tool
  (its name, each sentence of its description the catalogue does not repeat, each
  parameter; ``tool_fields``; the caller computes it), plus a share of ``lexical_scores``
  (the tool's name words in the request), plus, for a tool the workflow's past
  conversations that asked alike called (``learned_tools``: its recently called tools,
  by what was asked), that conversation's cosine, and a share of the request's cosine to
  the mean of the past requests that called it (``centroid_scores``); a bonus for the tools the workflow's
  conversations called together with the best scored ones, and for the tools that take
  an id a tool already called returns (``prerequisites``, read backwards);
- and the prerequisites of every tool sent: the lookup tool (``search_``/``find_``/
  ``list_``) whose results a sent tool's id parameter takes (``read_email``'s
  ``message_id`` is "Id returned by search_emails"; ``create_invoice``'s ``customer_id``
  is a "CRM customer id", which ``search_customers`` finds), so a lookup-then-act task
  has both halves on its first turn.

Tiered definitions: with ``stubs``, the next best scored tools past those go too, as
stubs (``stub_definition``: name, a one-line description, parameter names and types, which
of them are required; no parameter descriptions), about 60% of a full definition's tokens
here; with ``full``, only that many of the best scored go in full and the rest of the
scored picks as stubs. More tools reach the model within the same token budget. A call to
a stub whose arguments the full schema rejects is retried with the full definition (the
gateway's ``tool_retrieval``).

Past the stubs, ``by_name`` more of the best scored go by name alone (``name_definition``:
``{"name": ...}``, no description or parameters; ~16 tokens here against ~69 for a stub and
~118 in full). The name is often what tells the model which tool a request needs when the
embedding missed it ("HR sent me something" -> ``search_emails``); their lookups go by
name too. A call to one whose arguments the full schema rejects is retried with the full
definition, as for a stub.

They go out in canonical order (by name), stubs among the full ones, so a conversation
whose selection does not change sends byte-identical tool blocks turn after turn and the
engine's prefix cache keeps hitting; the query is the user turns only (not tool results),
so an agent's tool turns do not move the selection.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

QUERY_CHARS = 2000   # user text embedded as the query (latest turns kept)


@dataclass(frozen=True)
class Selection:
    sent: list[dict]                        # tools to send, canonical order
    # name -> choice|called|pinned|learned|companion|similar|prerequisite|stub
    reasons: dict[str, str] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)        # names not sent
    ranked: list[str] = field(default_factory=list)         # every tool, best scored first
    scores: dict[str, float] = field(default_factory=dict)  # name -> score ranked by
    # sent as stubs (reason "stub") or by name alone (reason "name"): each is retried with
    # its full definition when called with arguments that definition rejects
    stubbed: list[str] = field(default_factory=list)
    named: list[str] = field(default_factory=list)          # the stubbed sent by name alone

    @property
    def names(self) -> set[str]:
        return set(self.reasons)


def tool_name(tool: Any) -> str:
    fn = tool.get("function") if isinstance(tool, Mapping) else None
    name = fn.get("name") if isinstance(fn, Mapping) else None
    return name if isinstance(name, str) else ""


def _words(name: str) -> str:
    return " ".join(name.replace("_", " ").replace("-", " ").replace(".", " ").split())


def tool_text(tool: Mapping[str, Any]) -> str:
    """What a tool is embedded as: its name in words, description, and parameter names
    with their descriptions."""
    fn = tool.get("function") or {}
    parts = [_words(tool_name(tool)), str(fn.get("description") or "")]
    props = ((fn.get("parameters") or {}).get("properties") or {})
    if isinstance(props, Mapping):
        for key, spec in props.items():
            desc = spec.get("description") if isinstance(spec, Mapping) else None
            parts.append(f"{_words(str(key))}: {desc}" if desc else _words(str(key)))
    return ". ".join(p for p in parts if p)


_SENTENCE = re.compile(r"(?<=[.;!?])\s+")


def tool_fields(tools: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """Per tool, the texts embedded one by one (the tool scores its best field): its name
    in words, each sentence of its description that fewer than three of the catalogue's
    tools share (boilerplate like "use only when asked" says nothing about which tool),
    and each parameter with its description."""
    sentences = [[x.strip() for x in _SENTENCE.split(str(
        ((t.get("function") or {}).get("description")) or "")) if x.strip()] for t in tools]
    seen: dict[str, int] = {}
    for sents in sentences:
        for x in set(sents):
            seen[x] = seen.get(x, 0) + 1
    out = []
    for tool, sents in zip(tools, sentences):
        fields = [_words(tool_name(tool))] + [x for x in sents if seen[x] < 3]
        props = (((tool.get("function") or {}).get("parameters") or {}).get("properties")
                 or {})
        if isinstance(props, Mapping):
            for key, spec in props.items():
                desc = spec.get("description") if isinstance(spec, Mapping) else None
                fields.append(f"{_words(str(key))}: {desc}" if desc else _words(str(key)))
        out.append([f for f in fields if f])
    return out


_FIRST_SENTENCE = re.compile(r"(?<=[.!?])\s")
STUB_DESCRIPTION_WORDS = 8   # bench/results/agent_tools.txt: 0, 6, 8, 12 measured


def _stub_schema(spec: Any) -> dict:
    """A parameter's schema without its description: type (and enum, items, properties,
    required for nested ones) only."""
    if not isinstance(spec, Mapping):
        return {}
    out = {k: spec[k] for k in ("type", "enum", "const") if k in spec}
    if isinstance(spec.get("items"), Mapping):
        out["items"] = _stub_schema(spec["items"])
    if isinstance(spec.get("properties"), Mapping):
        out["properties"] = {k: _stub_schema(v) for k, v in spec["properties"].items()}
        if spec.get("required"):
            out["required"] = spec["required"]
    for key in ("anyOf", "oneOf"):
        if isinstance(spec.get(key), list):
            out[key] = [_stub_schema(v) for v in spec[key]]
    return out


def stub_definition(tool: Mapping[str, Any]) -> dict:
    """What a tool is sent as past the full ones: its name, the first sentence of its
    description (at most ``STUB_DESCRIPTION_WORDS`` words), its parameters' names and types
    and which are required, no parameter descriptions. Enough to call it; a call the full
    schema rejects is retried with the full definition."""
    fn = tool.get("function") or {}
    out: dict[str, Any] = {"name": tool_name(tool)}
    desc = str(fn.get("description") or "").strip()
    if desc:
        words = _FIRST_SENTENCE.split(desc, 1)[0].split()
        out["description"] = " ".join(words[:STUB_DESCRIPTION_WORDS]) + \
            (" ..." if len(words) > STUB_DESCRIPTION_WORDS else "")
    params = fn.get("parameters")
    if isinstance(params, Mapping):
        out["parameters"] = {"type": "object", **{
            k: v for k, v in _stub_schema(params).items() if k != "type"}}
    return {"type": "function", "function": out}


def name_definition(tool: Mapping[str, Any]) -> dict:
    """What a tool is sent as past the stubs: its name alone (OpenAI's and vLLM's function
    definitions take ``parameters`` as optional). A call the full schema rejects is retried
    with the full definition."""
    return {"type": "function", "function": {"name": tool_name(tool)}}


LOOKUP_VERBS = {"search", "find", "list", "lookup"}
_ID_PARAM = re.compile(r"(^|_)ids?$")


def _plural_stem(word: str) -> str:
    for suffix in ("ies", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[:-len(suffix)]
    return word


def prerequisites(tools: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Tool -> the lookup tools whose results its id parameters take: a parameter named
    ``*_id``/``*_ids`` (or described as ids) whose description names another tool, or
    else shares a word (singular) with a lookup tool's name (``search_customers`` for a
    "CRM customer id", ``search_drive`` for "Drive file ids to attach")."""
    names = [tool_name(t) for t in tools]
    lookups = {}
    for n in names:
        words = _words(n).lower().split(" ")
        if len(words) > 1 and words[0] in LOOKUP_VERBS:
            lookups[n] = {_plural_stem(w) for w in words[1:]}
    out: dict[str, list[str]] = {}
    for tool, name in zip(tools, names):
        props = (((tool.get("function") or {}).get("parameters") or {}).get("properties")
                 or {})
        if not isinstance(props, Mapping):
            continue
        found: list[str] = []
        for key, spec in props.items():
            desc = str(spec.get("description") or "") if isinstance(spec, Mapping) else ""
            words = {_plural_stem(w) for w in _WORD.findall(f"{key} {desc}".lower())}
            if not (_ID_PARAM.search(str(key)) or words & {"id", "ids"}):
                continue
            named = [n for n in names if n != name and n in desc]
            found += named or [n for n, ws in lookups.items()
                               if n != name and ws & (words - {"id", "ids"})]
        if found:
            out[name] = sorted(set(found))
    return out


def _text(content: Any) -> str:
    if isinstance(content, list):
        return " ".join(p.get("text") or "" for p in content if isinstance(p, Mapping))
    return content if isinstance(content, str) else ""


def query_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The user turns, latest last, cut to ``QUERY_CHARS`` from the end."""
    text = "\n".join(_text(m.get("content")) for m in messages
                     if isinstance(m, Mapping) and m.get("role") == "user")
    return text[-QUERY_CHARS:]


_WORD = re.compile(r"[a-z0-9]+")


def _stems(text: str) -> set[str]:
    return {w[:5] for w in _WORD.findall(text.lower()) if len(w) > 2}


def lexical_scores(query: str, tools: Sequence[Mapping[str, Any]]) -> list[float]:
    """Per tool, the share of its name's words (first five letters; not the catalogue's
    verbs) the query uses: "issue" finds ``create_github_issue`` where a sentence
    embedding of a bug report does not."""
    asked = _stems(query)
    # a word that starts three or more of the names is a verb of the catalogue (get_,
    # create_, search_): it says nothing about which tool is meant
    firsts: dict[str, int] = {}
    for tool in tools:
        first = _words(tool_name(tool)).split(" ")[0].lower()[:5]
        firsts[first] = firsts.get(first, 0) + 1
    verbs = {w for w, n in firsts.items() if n >= 3}
    out = []
    for tool in tools:
        words = _stems(_words(tool_name(tool))) - verbs
        out.append(len(words & asked) / len(words) if words else 0.0)
    return out


_CLAUSE = re.compile(r"(?<=[.?!;:])\s+|\s+(?:and then|then|and)\s+")
CLAUSE_MIN_CHARS = 9


def query_clauses(query: str) -> list[str]:
    """The parts of a request a multi-step ask joins ("find it and show me the full
    text", "Check online and remind me"): split at sentence ends, ``;``/``:`` and
    "and"/"then"; parts shorter than ``CLAUSE_MIN_CHARS`` dropped; [] when the request is
    one part. Each is scored on its own as well, so one step's tool is not drowned by the
    other's words."""
    parts = [p.strip() for p in _CLAUSE.split(query) if p and p.strip()]
    parts = [p for p in parts if len(p) >= CLAUSE_MIN_CHARS]
    return parts if len(parts) > 1 or (parts and parts[0] != query.strip()) else []


def called_names(messages: Iterable[Mapping[str, Any]]) -> list[str]:
    """Tools called earlier in the conversation (assistant ``tool_calls`` and the legacy
    ``function_call``), in order of first call."""
    out: list[str] = []
    for m in messages:
        if not isinstance(m, Mapping) or m.get("role") != "assistant":
            continue
        calls = list(m.get("tool_calls") or [])
        if isinstance(m.get("function_call"), Mapping):
            calls.append({"function": m["function_call"]})
        for c in calls:
            name = tool_name(c) if isinstance(c, Mapping) else ""
            if name and name not in out:
                out.append(name)
    return out


def choice_name(tool_choice: Any) -> str | None:
    if isinstance(tool_choice, Mapping):
        fn = tool_choice.get("function")
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            return fn["name"]
    return None


def parse_pinned(value: str) -> list[str]:
    return [n.strip() for n in (value or "").split(",") if n.strip()]


def learned_tools(query_vec: Any, memory: Sequence[tuple[Any, Sequence[str]]], *,
                  min_similarity: float, neighbours: int = 3) -> dict[str, float]:
    """Tools called in the workflow's past conversations whose user turns were like this
    one (cosine at least ``min_similarity``, the nearest ``neighbours``), each with the
    cosine of the nearest such conversation. ``memory``: (unit query vector, tools that
    conversation called)."""
    scored = sorted(((float(vec @ query_vec), names) for vec, names in memory),
                    key=lambda x: -x[0])
    out: dict[str, float] = {}
    for sim, names in scored[:neighbours]:
        if sim < min_similarity:
            break
        for n in names:
            out.setdefault(n, sim)
    return out


def centroid_scores(query_vec: Any, memory: Sequence[tuple[Any, Sequence[str]]], *,
                    threshold: float, weight: float) -> dict[str, float]:
    """Per tool the workflow's past conversations called: ``weight`` x (cos - threshold)
    / (1 - threshold) where the cosine of this query to the mean of those conversations'
    queries is over ``threshold``. One need asked in many wordings ("my inbox", "the
    mail from", "has she written") points the mean of its queries at what they share,
    which no single past wording need be near enough for ``learned_tools``. ``memory``
    as ``learned_tools`` takes it (unit vectors)."""
    sums: dict[str, Any] = {}
    for vec, names in memory:
        for name in names:
            got = sums.get(name)
            sums[name] = vec.copy() if got is None else got + vec
    out: dict[str, float] = {}
    for name, total in sums.items():
        norm = float(total @ total) ** 0.5
        if norm > 0:
            cos = float(total @ query_vec) / norm
            if cos > threshold:
                out[name] = weight * (cos - threshold) / (1.0 - threshold)
    return out


def co_called_counts(memory: Iterable[tuple[Any, Sequence[str]]]
                     ) -> dict[str, dict[str, int]]:
    """Tool -> {tool called in the same past conversation: how many conversations};
    ``memory`` as ``learned_tools`` takes it."""
    out: dict[str, dict[str, int]] = {}
    for _, called in memory:
        for a in called:
            for b in called:
                if a != b:
                    out.setdefault(a, {})
                    out[a][b] = out[a].get(b, 0) + 1
    return out


def _add_lookups(chosen: list[str], prerequisite: Mapping[str, Sequence[str]],
                 names: Sequence[str], *taken: Iterable[str]) -> None:
    """Appends to ``chosen`` the lookups (``prerequisite``) of the tools it holds that are
    among ``names`` and neither in it nor in ``taken``, each once."""
    for n in list(chosen):
        for pre in prerequisite.get(n) or ():
            if pre in names and pre not in chosen and not any(pre in t for t in taken):
                chosen.append(pre)


def select_tools(tools: Sequence[Mapping[str, Any]], messages: Sequence[Mapping[str, Any]],
                 tool_choice: Any, *, k: int, pinned: Iterable[str],
                 similarity: Sequence[float],
                 learned: Mapping[str, float] | None = None,
                 co_called: Mapping[str, Mapping[str, int]] | None = None,
                 companion_weight: float = 0.2, companion_of: int = 2,
                 k_max: int | None = None, margin: float = 0.0,
                 prerequisite: Mapping[str, Sequence[str]] | None = None,
                 consumer_weight: float = 0.2, low: float | None = None,
                 k_low: int = 0, margin_low: float | None = None,
                 stubs: int = 0, full: int | None = None, by_name: int = 0) -> Selection:
    """The tools to send (see the module doc). ``similarity[i]`` scores ``tools[i]``
    against the conversation; ties keep the client's order. ``learned``: tools the
    workflow's alike past conversations called (``learned_tools``); their cosine is added
    to their score, so a strong direct match still competes with a weak neighbour.
    ``co_called``: tool -> tools called with it in the workflow's past conversations
    (``co_called_counts``); the companions of the ``companion_of`` best scored
    tools get ``companion_weight`` more (a customer lookup before an invoice). The ``k``
    best scored go, then up to ``k_max`` (default ``k``) those within ``margin`` of the
    best. ``prerequisite`` (``prerequisites``): the lookups of every tool sent go too,
    and a tool whose lookup was called gets ``consumer_weight`` more. ``low``: when the
    best score is under it and no tool has been called yet (nothing matches the request
    well, so the ranking below the top is noise), up to ``k_low`` go, those within
    ``margin_low`` of the best. ``stubs``: the next that many best scored go as stubs
    (``stub_definition``, reason "stub"); ``full``: only that many of the best scored go
    in full, the rest of them as stubs too; ``by_name``: the next that many past the stubs
    go by name alone (``name_definition``, reason "name"). The choice, pinned tools and
    lookups always go in full; a called tool goes in the form its rank gives it (reason
    "called"; in full when it ranks nowhere near, as after a call to a tool not sent)."""
    names = [tool_name(t) for t in tools]
    reasons: dict[str, str] = {}
    called = called_names(messages)
    must = [(choice_name(tool_choice), "choice")]
    must += [(n, "called") for n in called]
    must += [(n, "pinned") for n in pinned]
    for name, why in must:
        if name in names and name not in reasons:
            reasons[name] = why
    learned = learned or {}
    prerequisite = prerequisite or {}
    score = [float(similarity[i]) + learned.get(names[i], 0.0) for i in range(len(tools))]
    boosted: set[str] = set()
    if co_called:
        best = sorted(range(len(tools)), key=lambda i: (-score[i], i))[:companion_of]
        for i in best:
            boosted.update(n for n in (co_called.get(names[i]) or {}) if n != names[i])
        score = [s + (companion_weight if names[i] in boosted else 0.0)
                 for i, s in enumerate(score)]
    if prerequisite and called:
        after = {n for n, pre in prerequisite.items() if set(pre) & set(called)}
        score = [s + (consumer_weight if names[i] in after else 0.0)
                 for i, s in enumerate(score)]
    ranked = sorted(range(len(tools)), key=lambda i: (-score[i], i))
    k_max = max(k, k_max or k)
    if low is not None and not called and ranked and score[ranked[0]] < low:
        k_max = max(k_max, k_low)
        margin = margin if margin_low is None else margin_low
    picked: list[str] = []
    for i in ranked:
        if len(picked) >= k_max or (len(picked) >= k and score[i] < score[ranked[0]] - margin):
            break
        picked.append(names[i])
    # Which tools go as stubs follows the ranking alone, not what was called: a tool the
    # agent called keeps the form it was sent in, so the tool block stays byte-identical
    # from turn to turn (a called stub in full on the next turn changed it, and with it
    # the engine's prefix cache: bench/results/agent_tools.txt, round 4)
    in_full = {n for n, why in reasons.items() if why in ("choice", "pinned")}
    tail = picked[full:] if full is not None else []
    for name in picked:
        reasons.setdefault(name, "learned" if name in learned
                           else "companion" if name in boosted else "similar")
    for name in list(reasons):
        for pre in prerequisite.get(name) or ():
            if pre in names:
                reasons.setdefault(pre, "prerequisite")
    extra = [names[i] for i in ranked if names[i] not in picked
             and reasons.get(names[i]) in (None, "called")][:max(0, stubs)]
    # a stub's lookups go too, as stubs: a stub the model calls needs the id they return
    # (read_email sent as a stub without search_emails could not be used)
    _add_lookups(extra, prerequisite, names, reasons)
    stubbed = [n for n in tail + extra if n not in in_full]
    for name in stubbed:
        if reasons.get(name) != "called":
            reasons[name] = "stub"
    # by name alone: the next best scored past the stubs, and their lookups by name too
    # (summarize_document went by name without search_drive, whose ids it takes: day 9
    # of bench/results/agent_tools.txt)
    named = [names[i] for i in ranked if names[i] not in picked and names[i] not in stubbed
             and reasons.get(names[i]) in (None, "called")][:max(0, by_name)]
    _add_lookups(named, prerequisite, names, reasons, stubbed)
    for name in named:
        if reasons.get(name) != "called":
            reasons[name] = "name"
    stub_set, name_set = set(stubbed), set(named)
    sent = sorted((stub_definition(t) if n in stub_set else name_definition(t)
                   if n in name_set else t
                   for t, n in zip(tools, names) if n in reasons), key=tool_name)
    return Selection(sent, reasons, [n for n in names if n not in reasons],
                     [names[i] for i in ranked], {names[i]: score[i] for i in ranked},
                     stubbed + named, named)
