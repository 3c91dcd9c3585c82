"""Cache keys: what two requests must share to get the same answer. Pure."""
from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from app.contract.cache.embedding import fits_window, question_text, semantic_text
from app.contract.policy import ANSWER_FIELDS, ROUTING_FIELDS
from app.core.entities import EntityProfile, entity_profile

# Body fields that change the answer (besides messages and the model).
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "max_tokens", "max_completion_tokens", "n",
                   "stop", "seed", "presence_penalty", "frequency_penalty", "logit_bias",
                   "logprobs", "top_logprobs", "tools", "tool_choice", "functions",
                   "response_format", "parallel_tool_calls", "reasoning_effort")
OPENAI_DEFAULT_TEMPERATURE = 1.0


def _h(obj: Any) -> str:
    raw = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str, ensure_ascii=False)
    return hashlib.sha256(raw.encode()).hexdigest()


_POLICY_HASHES: dict[tuple[int, bool, bool], tuple[Mapping[str, Any], str]] = {}


@functools.lru_cache(maxsize=4)
def _left_out(schema: bool, tools: bool) -> frozenset[str]:
    """Fields outside the key of such a request: routing ones, and answer-shaping ones that
    act on what it does not carry (a schema, tools)."""
    applies = set(ANSWER_FIELDS["any"])
    applies.update(ANSWER_FIELDS["schema"] if schema else ())
    applies.update(ANSWER_FIELDS["tools"] if tools else ())
    answer = {f for fields in ANSWER_FIELDS.values() for f in fields}
    return frozenset(ROUTING_FIELDS | (answer - applies))


def policy_hash(policy: Mapping[str, Any], schema: bool = False, tools: bool = False) -> str:
    """The part of a tenant's policy that can change the answer to a request with (or
    without) a response schema and tools (``ANSWER_FIELDS``), hashed. Routing, budget,
    lookup and learning fields are left out, so editing them keeps the tenant's cached
    answers. Remembered per policy object: the gateway's policies are the snapshot's dicts,
    never changed in place (a new snapshot brings new objects), and hashing one costs as much
    as a cache lookup. The entry holds the object, so its id cannot be reused while
    remembered."""
    memo = (id(policy), schema, tools)
    known = _POLICY_HASHES.get(memo)
    if known is not None and known[0] is policy:
        return known[1]
    digest = _h({k: v for k, v in policy.items() if k not in _left_out(schema, tools)})[:16]
    if len(_POLICY_HASHES) >= 4096:
        _POLICY_HASHES.clear()
    _POLICY_HASHES[memo] = (policy, digest)
    return digest


def schema_version(schema: Any) -> str:
    """A stable id for the response schema ("" when none was asked)."""
    if schema in (None, "", {}):
        return ""
    if isinstance(schema, str):
        return schema
    return _h(schema)[:16]


def _norm_messages(messages: Sequence[dict]) -> list[dict]:
    out = []
    for m in messages or ():
        content = m.get("content")
        if isinstance(content, str):
            content = " ".join(content.split())
        out.append({k: (content if k == "content" else v) for k, v in sorted(m.items())})
    return out


@dataclass(frozen=True)
class CacheKey:
    tenant_id: str
    policy_hash: str
    schema_version: str
    model: str
    exact_hash: str         # the whole request: exact-cache key
    history_hash: str       # every turn before the last user turn
    text: str               # what is embedded: the last user turn
    profile: EntityProfile  # of the whole conversation
    semantic: bool = True   # the embedding sees all of ``text``; else exact matches only

    @property
    def composite(self) -> str:
        """Semantic candidates must share this exactly before any vector math."""
        return _h([self.tenant_id, self.policy_hash, self.schema_version, self.model,
                   self.history_hash, self.profile.signature_hash])[:32]


# Past this much user/system text, the entity guard reads the question alone.
MAX_ENTITY_CHARS = 32_768
_UNSCANNED = EntityProfile("unscanned", None, frozenset())


def build_key(tenant_id: Any, policy: Mapping[str, Any], model: str, body: Mapping[str, Any],
              messages: Sequence[dict] | None = None, schema: Any = None) -> CacheKey:
    """``messages`` defaults to ``body["messages"]``; ``schema`` to ``body["response_format"]``."""
    messages = list(body.get("messages") or []) if messages is None else list(messages)
    if schema is None:
        schema = body.get("response_format")
    sampling = {f: body[f] for f in SAMPLING_FIELDS if f in body and f != "response_format"}
    sampling.setdefault("temperature", OPENAI_DEFAULT_TEMPERATURE)
    sv, tenant = schema_version(schema), str(tenant_id)
    ph = policy_hash(policy, bool(sv), bool(body.get("tools") or body.get("functions")))
    norm = _norm_messages(messages)
    last_user = max((i for i, m in enumerate(norm) if m.get("role") == "user"), default=len(norm))
    exact = _h([tenant, ph, sv, model, sampling, norm])
    # Everything but the question's own text: the turns before it, the tool set, and an
    # agent's turns after it (its tool calls and their results), so an answer given after
    # one tool result is never a semantic match for a conversation with another.
    after = norm[last_user + 1:]
    history = _h([norm[:last_user], sampling, after] if after else [norm[:last_user], sampling])
    text = question_text(messages)
    if not fits_window(text):   # exact matches only: no semantic lookup, no entity scan
        return CacheKey(tenant, ph, sv, model, exact, history, text, _UNSCANNED, False)
    scanned = semantic_text(messages)
    if len(scanned) > MAX_ENTITY_CHARS:
        # The scan costs ~10 us a character (a 4 MiB prompt held the gateway's CPU for a
        # minute). Everything before the question is bound exactly by history_hash, so two
        # requests that may share an answer have the same history: scanning the question
        # alone (it fits the embedding window) tells them apart just as well.
        scanned = text
    return CacheKey(tenant, ph, sv, model, exact, history, text, entity_profile(scanned), True)


def is_cacheable_request(body: Mapping[str, Any], policy: Mapping[str, Any]) -> bool:
    """Cache only deterministic-enough requests: cache on, temperature within the policy's
    bound (an absent temperature is OpenAI's default 1.0), one choice."""
    if not policy["cache_enabled"]:
        return False
    temp = body.get("temperature")
    temp = OPENAI_DEFAULT_TEMPERATURE if temp is None else float(temp)
    return temp <= float(policy.get("cache_max_temperature", 0.0)) and int(body.get("n") or 1) == 1


def is_cacheable_response(response: Mapping[str, Any], *, schema_valid: bool | None = None,
                          negative_feedback: bool = False) -> bool:
    """Only complete answers: every choice stopped, hit the length limit or ended in tool
    calls, and carries content or tool calls; a schema that was asked for validated
    (``schema_valid`` False refuses). A tool call is keyed on the tool set and every turn
    (``build_key``), so it is served only to the same conversation with the same tools."""
    if negative_feedback or schema_valid is False or response.get("error"):
        return False
    choices = response.get("choices") or []
    if not choices:
        return False
    for ch in choices:
        if ch.get("finish_reason") not in ("stop", "length", "tool_calls"):
            return False
        msg = ch.get("message") or {}
        if not (msg.get("content") or msg.get("tool_calls")):
            return False
    return True
