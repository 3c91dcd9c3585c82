"""Pool.options, typed: the engine settings Sluice supports, with their types and ranges,
an allowlist of environment variables, and free-form engine arguments only from a list
of the engine's own flags that load no code (pure; the console validates with it and the
node refuses again before it starts an engine).

Nothing here can make an engine run code of the operator's choosing: no ``LD_PRELOAD``,
``PYTHON*`` or ``BROWSER`` variables, no ``--worker-extension-cls``, ``--worker-cls``,
``--trust-remote-code``, ``--chat-template``, ``--*-plugin``, ``--logits-processors`` or
``--middleware``: those are not in the lists, so they are refused (security finding 3).
``extra_args`` itself is admin-only and audited (``app.catalog.service``).
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Callable

QUANTIZATIONS = ("fp8", "awq", "awq_marlin")
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
HASH_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
SPEC_METHODS = ("eagle", "eagle3", "ngram")
PD_ROLES = ("prefill", "decode")
KV_CONNECTORS = ("NixlConnector",)
LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
# vLLM's built-in --tool-call-parser names (the reference engine has hermes)
TOOL_PARSERS = ("hermes", "llama3_json", "llama4_json", "llama4_pythonic", "mistral",
                "pythonic", "granite", "granite-20b-fc", "internlm", "jamba", "xlam",
                "qwen3_coder", "qwen3_xml", "deepseek_v3", "deepseek_v31", "kimi_k2",
                "glm45", "openai", "minimax", "hunyuan_a13b", "phi4_mini_json")

# Environment variables an operator may set on an engine: communication and runtime
# tuning only, nothing that names code to load.
ENV_ALLOWED = frozenset({
    "CUDA_DEVICE_ORDER", "CUDA_LAUNCH_BLOCKING", "NCCL_DEBUG", "NCCL_SOCKET_IFNAME",
    "NCCL_IB_DISABLE", "NCCL_P2P_DISABLE", "NCCL_CUMEM_ENABLE", "GLOO_SOCKET_IFNAME",
    "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME", "TOKENIZERS_PARALLELISM",
    "OMP_NUM_THREADS", "PYTORCH_CUDA_ALLOC_CONF", "VLLM_ATTENTION_BACKEND",
    "VLLM_LOGGING_LEVEL", "VLLM_USE_DEEP_GEMM", "VLLM_ENGINE_ITERATION_TIMEOUT_S",
    "VLLM_RPC_TIMEOUT", "VLLM_HOST_IP"})

# ``vllm serve`` flags (vLLM's own names, late 2026) that tune serving and load no code.
VLLM_EXTRA_FLAGS = frozenset({
    "--block-size", "--swap-space", "--cpu-offload-gb", "--seed", "--dtype",
    "--max-num-batched-tokens", "--enable-chunked-prefill", "--no-enable-chunked-prefill",
    "--max-num-partial-prefills", "--long-prefill-token-threshold", "--enforce-eager",
    "--max-seq-len-to-capture", "--scheduling-policy", "--pipeline-parallel-size",
    "--data-parallel-size", "--enable-expert-parallel", "--disable-log-stats",
    "--disable-log-requests", "--uvicorn-log-level", "--async-scheduling",
    "--num-gpu-blocks-override", "--max-logprobs", "--disable-custom-all-reduce"})
# The reference engine's own flags that the driver does not set itself.
REFERENCE_EXTRA_FLAGS = frozenset({"--block-size"})
_ARG_VALUE = re.compile(r"^[A-Za-z0-9._:,=+-]{1,64}$")
_PATH = re.compile(r"^[A-Za-z0-9._/:@+-]{1,300}$")
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_ENV_VALUE = re.compile(r"^[^\x00-\x1f]{0,256}$")

Check = Callable[[Any], "str | None"]


def _int(lo: int, hi: int) -> Check:
    return lambda v: None if isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi \
        else f"must be a whole number from {lo} to {hi}"


def _choice(values: tuple) -> Check:
    return lambda v: None if v in values else f"must be one of {', '.join(map(str, values))}"


def _bool(v: Any) -> str | None:
    return None if isinstance(v, bool) else "must be true or false"


def _fraction(v: Any) -> str | None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1
    return None if ok else "must be in (0, 1]"


def _path(v: Any) -> str | None:
    return None if isinstance(v, str) and _PATH.match(v) else \
        "must be a model name or path (letters, digits, . _ / : @ + -)"


def _object(fields: dict[str, Check], required: tuple[str, ...] = ()) -> Check:
    def check(v: Any) -> str | None:
        if not isinstance(v, Mapping):
            return f"must be an object with {', '.join(fields)}"
        for name in required:
            if name not in v:
                return f"needs '{name}'"
        for name, value in v.items():
            if name not in fields:
                return f"unknown field '{name}' (known: {', '.join(fields)})"
            problem = fields[name](value)
            if problem:
                return f"{name} {problem}"
        return None
    return check


def _lora_modules(v: Any) -> str | None:
    if not isinstance(v, Mapping):
        return "must be an object {adapter name: path}"
    for name, path in v.items():
        if not _NAME.match(str(name)) or _path(path):
            return f"'{name}' needs a plain adapter name and a path"
    return None


def _kv_events(v: Any) -> str | None:
    if isinstance(v, bool):
        return None
    return _object({"endpoint": _path, "topic": _path, "port": _int(1024, 65000),
                    "publisher": _choice(("zmq", "null"))})(v)


def _env(v: Any) -> str | None:
    if not isinstance(v, Mapping):
        return "must be an object {VARIABLE: value}"
    refused = sorted(str(k) for k in v if k not in ENV_ALLOWED)
    if refused:
        return (f"may not set {', '.join(refused)} (allowed: {', '.join(sorted(ENV_ALLOWED))})")
    bad = [k for k, val in v.items() if not isinstance(val, (str, int, float))
           or not _ENV_VALUE.match(str(val))]
    return f"{', '.join(bad)}: a value is plain text of at most 256 characters" if bad else None


SPECULATIVE = _object({"method": _choice(SPEC_METHODS), "model": _path,
                       "num_speculative_tokens": _int(1, 16),
                       "num_speculative_tokens_per_batch_size": lambda v: None,
                       "prompt_lookup_min": _int(1, 64), "prompt_lookup_max": _int(1, 64),
                       "draft_tensor_parallel_size": _int(1, 64)},
                      required=("method", "num_speculative_tokens"))

OPTIONS: dict[str, Check] = {
    "quantization": _choice(QUANTIZATIONS),
    "kv_cache_dtype": _choice(KV_CACHE_DTYPES),
    "prefix_caching": _bool,
    "prefix_caching_hash_algo": _choice(HASH_ALGOS),
    "speculative": SPECULATIVE,
    "lora": _object({"max_loras": _int(1, 256), "max_lora_rank": _choice(LORA_RANKS),
                     "modules": _lora_modules}),
    "disaggregation": _object({"role": _choice(PD_ROLES), "connector": _choice(KV_CONNECTORS),
                               "side_channel_port": _int(1024, 65000)}, required=("role",)),
    "kv_events": _kv_events,
    "gpu_memory_utilization": _fraction,
    "max_num_seqs": _int(1, 65536),
    "max_model_len": _int(16, 10_000_000),
    "tensor_parallel_size": _int(1, 64),
    "enable_prompt_tokens_details": _bool,
    "max_prefix_tokens": _int(0, 10_000_000),
    "threads": _int(0, 512),
    "tool_call_parser": lambda v: None if v is False else _choice(TOOL_PARSERS)(v),
    "env": _env,
    "extra_args": lambda v: None,   # checked against the engine below
}


def check_extra_args(args: Any, engine: str) -> str | None:
    """``extra_args``: ``["--flag", "value", "--switch", ...]`` with every flag one of the
    engine's own that loads no code, and every value a short plain token."""
    if not isinstance(args, list) or not all(isinstance(a, (str, int, float)) for a in args):
        return "must be a list of engine arguments"
    allowed = VLLM_EXTRA_FLAGS if engine == "vllm" else REFERENCE_EXTRA_FLAGS
    for raw in map(str, args):
        flag = raw.split("=", 1)[0]
        if raw.startswith("-"):
            if flag not in allowed:
                return (f"{flag} is not an engine flag Sluice passes through (allowed: "
                        f"{', '.join(sorted(allowed))})")
            if "=" in raw and not _ARG_VALUE.match(raw.split("=", 1)[1]):
                return f"{raw}: a value is a short plain token"
        elif not _ARG_VALUE.match(raw):
            return f"{raw!r}: a value is a short plain token"
    return None


def validate(options: Mapping[str, Any], engine: str = "reference") -> dict[str, list[str]]:
    """Errors per option; empty when every option is known and well-typed."""
    if not isinstance(options, Mapping):
        return {"options": ["must be a JSON object"]}
    errors: dict[str, list[str]] = {}
    for name, value in options.items():
        check = OPTIONS.get(name)
        if check is None:
            errors[name] = [f"unknown option (known: {', '.join(sorted(OPTIONS))})"]
            continue
        problem = check_extra_args(value, engine) if name == "extra_args" else check(value)
        if problem:
            errors[name] = [problem]
    return errors
