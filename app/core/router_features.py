"""Router features (S01): the request embedding, passed in, plus cheap structural features. Pure.

The embedding is the one computed at S00 for the cache (one embedding per request); it is
never recomputed here. Structural features are a handful of regex counts on the prompt
text, scaled to roughly [0, 1], and a one-hot bucket of the workflow id.
"""
from __future__ import annotations

import hashlib
import math
import re
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

WORKFLOW_BUCKETS = 16
EMBEDDING_DIM = 384

_CODE = re.compile(r"```|\bdef \w+\(|\bfunction\b|\bclass \w+|=>|\breturn\b|[{};]\s*$|#include"
                   r"|\bimport \w+|\bconsole\.log\b|\bpublic static\b", re.M)
_SQL = re.compile(r"\b(select|insert into|update \w+ set|delete from|create table|join|where"
                  r"|group by|order by|having)\b", re.I)
_MULTI_HOP = re.compile(
    r"\b(why|explain|compare|contrast|derive|prove|justify|implications?|trade-?offs?|"
    r"step[- ]by[- ]step|and then|therefore|consequently|given that|assuming|suppose|"
    r"what if|how would|under what|reconcile|analy[sz]e|evaluate|whether)\b", re.I)
# Capitalised names (runs of capitalised words count once) and numbers: a rough entity count.
_ENTITY = re.compile(r"\b[A-Z][a-zA-Z]+(?:\s+[A-Z][a-zA-Z]+)*|\b\d[\d,.%$-]*")
_WORD = re.compile(r"\w+")

STRUCTURAL_NAMES = ("log_chars", "log_words", "schema", "code", "sql", "multi_hop",
                    "entities", "depth", "questions", "digits_frac")


def prompt_text(messages: Iterable[Mapping[str, Any]]) -> str:
    """The text of the non-system messages (string content or text parts)."""
    parts = []
    for m in messages:
        if m.get("role") in ("system", "developer"):
            continue
        c = m.get("content")
        if isinstance(c, str):
            parts.append(c)
        elif isinstance(c, list):
            parts.extend(p.get("text", "") for p in c
                         if isinstance(p, Mapping) and p.get("type") == "text")
    return "\n".join(parts)


def workflow_bucket(workflow: str | None, buckets: int = WORKFLOW_BUCKETS) -> int:
    """Stable bucket of a workflow id (-1 for none); the same on every process."""
    if not workflow:
        return -1
    return int.from_bytes(hashlib.blake2b(workflow.encode(), digest_size=4).digest(), "big") % buckets


def structural_features(text: str, *, schema_present: bool, depth: int = 1,
                        workflow: str | None = None) -> np.ndarray:
    """Structural features, then the one-hot workflow bucket: len(STRUCTURAL_NAMES) + 16 floats."""
    words = len(_WORD.findall(text))
    chars = len(text)
    digits = sum(ch.isdigit() for ch in text)
    feats = [
        math.log1p(chars) / 10.0,
        math.log1p(words) / 8.0,
        1.0 if schema_present else 0.0,
        min(len(_CODE.findall(text)), 5) / 5.0,
        min(len(_SQL.findall(text)), 5) / 5.0,
        min(len(_MULTI_HOP.findall(text)), 6) / 6.0,
        math.log1p(len(_ENTITY.findall(text))) / 4.0,
        math.log1p(max(depth, 1) - 1) / 3.0,
        min(text.count("?"), 4) / 4.0,
        digits / chars if chars else 0.0,
    ]
    onehot = [0.0] * WORKFLOW_BUCKETS
    b = workflow_bucket(workflow)
    if b >= 0:
        onehot[b] = 1.0
    return np.asarray(feats + onehot, dtype=np.float32)


def request_features(embedding: Sequence[float] | np.ndarray, messages: Sequence[Mapping[str, Any]],
                     *, schema_present: bool, workflow: str | None = None) -> np.ndarray:
    """The router's input vector: [embedding, structural features] (float32)."""
    text = prompt_text(messages)
    depth = sum(1 for m in messages if m.get("role") == "user")
    emb = np.asarray(embedding, dtype=np.float32).ravel()
    return np.concatenate([emb, structural_features(text, schema_present=schema_present,
                                                    depth=depth, workflow=workflow)])


def feature_dim(embedding_dim: int = EMBEDDING_DIM) -> int:
    return embedding_dim + len(STRUCTURAL_NAMES) + WORKFLOW_BUCKETS
