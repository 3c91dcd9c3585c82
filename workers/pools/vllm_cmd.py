"""Pool + replica index -> the engine's command line and environment (pure).

``engine == "vllm"`` builds ``vllm serve`` (flag spellings checked against vLLM's
source, see DESIGN.md); ``engine == "reference"`` builds ``python -m app.engine`` with
the same HTTP API on CPU. ``pool`` is plain data shaped like ``Pool.to_dict()``.

Pool.options (all optional)::

    quantization: fp8 | awq | awq_marlin        kv_cache_dtype: fp8 | auto
    prefix_caching: bool (vLLM default on)      prefix_caching_hash_algo: sha256 | ...
    speculative: {method: eagle|eagle3|ngram, model, num_speculative_tokens,
                  num_speculative_tokens_per_batch_size: [[start, end, K], ...],
                  prompt_lookup_min, prompt_lookup_max, draft_tensor_parallel_size}
    lora: {max_loras, max_lora_rank, modules: {name: path}}
    disaggregation: {role: prefill | decode, connector: NixlConnector, side_channel_port}
    kv_events: true | {endpoint, topic, publisher}
    gpu_memory_utilization, max_num_seqs, max_model_len, tensor_parallel_size,
    enable_prompt_tokens_details (default true), max_prefix_tokens (reference engine),
    tool_call_parser (vLLM's parser name, or false; default by model family),
    threads (reference engine), extra_args: [...] (engine flags from an allowlist, admin
    only), env: {...} (variables from an allowlist)

Types, ranges and the allowlists are ``workers.pools.engine_options``; nothing in the
options can load code into an engine.
"""
from __future__ import annotations

import json
import re
import sys
from typing import Any, Mapping

from workers.pools import engine_options

NIXL_SIDE_CHANNEL_BASE = 5600
KV_EVENTS_BASE = 5557          # PUB socket of replica i: (kv_events.port or this) + i
KV_EVENTS_REPLAY_SHIFT = 100   # ROUTER socket answering replay requests: its PUB port + 100
_TCP_PORT = re.compile(r"^(tcp://[^/]*:)(\d+)$")


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def validate_options(options: Mapping[str, Any], engine: str = "vllm") -> dict[str, list[str]]:
    """Errors per option name; empty when the options make a valid command line. Types,
    ranges and allowlists come from ``engine_options``; here, what ties fields together."""
    errors = engine_options.validate(options, engine)
    spec = options.get("speculative") if isinstance(options, Mapping) else None
    if isinstance(spec, Mapping) and "speculative" not in errors:
        if spec["method"] != "ngram" and not spec.get("model"):
            errors.setdefault("speculative", []).append("eagle needs a draft 'model'")
        table = spec.get("num_speculative_tokens_per_batch_size")
        if table is not None and not _valid_depth_table(table, spec["num_speculative_tokens"]):
            errors.setdefault("speculative", []).append(
                "num_speculative_tokens_per_batch_size must be [[start, end, K], ...] "
                "with start <= end, ranges ascending and K <= num_speculative_tokens")
    return errors


def _valid_depth_table(table: Any, k: Any) -> bool:
    if not isinstance(table, list) or not table:
        return False
    last_end = 0
    for row in table:
        if not (isinstance(row, list) and len(row) == 3 and all(isinstance(x, int) for x in row)):
            return False
        start, end, depth = row
        if start < 1 or start > end or start <= last_end or depth < 0:
            return False
        if isinstance(k, int) and depth > k:
            return False
        last_end = end
    return True


def replica_port(pool: Mapping[str, Any], index: int) -> int:
    return int(pool.get("base_port", 8500)) + index


def build_command(pool: Mapping[str, Any], index: int, *, host: str = "127.0.0.1",
                  python: str | None = None) -> tuple[list[str], dict[str, str]]:
    """(argv, extra environment) for replica ``index`` of ``pool``.
    Raises ValueError when the options are invalid."""
    options = dict(pool.get("options") or {})
    errors = validate_options(options, pool.get("engine", "reference"))
    if errors:
        raise ValueError("; ".join(f"{k}: {' '.join(v)}" for k, v in sorted(errors.items())))
    if pool.get("engine", "reference") == "vllm":
        argv, env = _vllm(pool, options, index, host)
    else:
        argv, env = _reference(pool, options, index, host, python or sys.executable)
    argv += tool_call_flags(pool)
    argv += [str(a) for a in options.get("extra_args") or []]
    env.update({str(k): str(v) for k, v in (options.get("env") or {}).items()})
    return argv, env


# vLLM's --tool-call-parser per model family (vLLM's docs, "Tool Calling"), first match wins.
TOOL_PARSER_BY_MODEL = (("llama-4", "llama4_pythonic"), ("llama4", "llama4_pythonic"),
                        ("llama-3", "llama3_json"), ("llama3", "llama3_json"),
                        ("qwen3-coder", "qwen3_coder"), ("qwen", "hermes"),
                        ("hermes", "hermes"), ("mistral", "mistral"), ("mixtral", "mistral"),
                        ("granite", "granite"), ("deepseek-v3", "deepseek_v3"),
                        ("gpt-oss", "openai"), ("xlam", "xlam"))


def tool_call_parser(pool: Mapping[str, Any]) -> str | None:
    """The pool's tool-call parser: ``options.tool_call_parser`` (false: none), else the
    model family's, else none (``tool_choice: auto`` is then refused by the engine).
    The reference engine parses Hermes-style calls."""
    chosen = (pool.get("options") or {}).get("tool_call_parser")
    if chosen is False:
        return None
    if chosen:
        return str(chosen)
    if pool.get("engine", "reference") != "vllm":
        return "hermes"
    model = str(pool.get("model") or "").lower()
    return next((parser for family, parser in TOOL_PARSER_BY_MODEL if family in model), None)


def tool_call_flags(pool: Mapping[str, Any]) -> list[str]:
    """vLLM's flags for ``tool_choice: auto`` (the reference engine takes the same)."""
    parser = tool_call_parser(pool)
    return ["--enable-auto-tool-choice", "--tool-call-parser", parser] if parser else []


def _served_name(pool: Mapping[str, Any]) -> str:
    return pool.get("served_model_name") or pool["name"]


def _vllm(pool: Mapping[str, Any], o: dict, index: int, host: str) -> tuple[list[str], dict]:
    argv = ["vllm", "serve", pool["model"], "--served-model-name", _served_name(pool),
            "--host", host, "--port", str(replica_port(pool, index))]
    env: dict[str, str] = {}
    gpus = int(pool.get("gpus_per_replica", 1) or 0)
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(index * gpus + g) for g in range(gpus))
    tp = int(o.get("tensor_parallel_size") or gpus or 1)
    if tp > 1:
        argv += ["--tensor-parallel-size", str(tp)]
    if o.get("max_model_len"):
        argv += ["--max-model-len", str(o["max_model_len"])]
    if o.get("quantization"):
        argv += ["--quantization", o["quantization"]]
    if o.get("kv_cache_dtype"):
        argv += ["--kv-cache-dtype", o["kv_cache_dtype"]]
    if o.get("gpu_memory_utilization") is not None:
        argv += ["--gpu-memory-utilization", str(o["gpu_memory_utilization"])]
    if o.get("max_num_seqs"):
        argv += ["--max-num-seqs", str(o["max_num_seqs"])]
    if o.get("prefix_caching", True):
        argv.append("--enable-prefix-caching")
        if o.get("prefix_caching_hash_algo"):
            argv += ["--prefix-caching-hash-algo", o["prefix_caching_hash_algo"]]
    else:
        argv.append("--no-enable-prefix-caching")
    spec = o.get("speculative")
    if spec:
        argv += ["--speculative-config", _json(_spec_config(spec))]
    lora = o.get("lora")
    if lora is not None:
        argv += ["--enable-lora", "--max-loras", str(lora.get("max_loras", 4)),
                 "--max-lora-rank", str(lora.get("max_lora_rank", 16))]
        modules = lora.get("modules") or {}
        if modules:
            argv += ["--lora-modules", *[f"{n}={p}" for n, p in sorted(modules.items())]]
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    pd = o.get("disaggregation")
    if pd:
        # Nixl peers both send and receive KV; the proxy decides who prefills.
        argv += ["--kv-transfer-config", _json({"kv_connector": pd.get("connector",
                                                                        "NixlConnector"),
                                                "kv_role": "kv_both"})]
        base = int(pd.get("side_channel_port", NIXL_SIDE_CHANNEL_BASE))
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(base + index)
        env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = host
    if o.get("kv_events"):
        argv += ["--kv-events-config", _json(kv_events_config(pool, index))]
    if o.get("enable_prompt_tokens_details", True):
        argv.append("--enable-prompt-tokens-details")
    return argv, env


def kv_events_config(pool: Mapping[str, Any], index: int) -> dict[str, Any]:
    """vLLM's ``--kv-events-config`` of replica ``index`` (the reference engine takes the
    same JSON): a ZMQ PUB socket and a ROUTER socket for replays, one port each per
    replica, so a subscriber that sees a sequence gap asks for the missed batches."""
    events = (pool.get("options") or {}).get("kv_events")
    cfg = dict(events) if isinstance(events, Mapping) else {}
    pub = int(cfg.get("port", KV_EVENTS_BASE)) + index
    endpoint = cfg.get("endpoint")
    if endpoint is None:
        endpoint = f"tcp://*:{pub}"
    else:   # an explicit endpoint is replica 0's: replica i's port is i more
        m = _TCP_PORT.match(str(endpoint))
        if m:
            pub = int(m.group(2)) + index
            endpoint = f"{m.group(1)}{pub}"
        elif index:
            endpoint = f"{endpoint}-{index}"
    return {"enable_kv_cache_events": True, "publisher": cfg.get("publisher", "zmq"),
            "endpoint": endpoint,
            "replay_endpoint": f"tcp://*:{pub + KV_EVENTS_REPLAY_SHIFT}",
            "topic": cfg.get("topic", f"kv@{_served_name(pool)}-{index}")}


def node_ports(pool: Mapping[str, Any], replicas: int | None = None) -> dict[int, str]:
    """The TCP ports a pool's replicas bind on their node, each with what it is for: the
    HTTP port of each, and with ``kv_events`` its PUB and replay sockets, with a P/D
    connector its NIXL side channel. Two pools on one node must not share any."""
    n = int(pool.get("desired_replicas", 1) if replicas is None else replicas)
    o = pool.get("options") or {}
    out: dict[int, str] = {}
    for i in range(n):
        out[replica_port(pool, i)] = f"replica {i} HTTP"
        if o.get("kv_events"):
            cfg = kv_events_config(pool, i)
            for key, what in (("endpoint", "KV events"), ("replay_endpoint", "KV replay")):
                m = _TCP_PORT.match(str(cfg[key]))
                if m:
                    out[int(m.group(2))] = f"replica {i} {what}"
        pd = o.get("disaggregation")
        if isinstance(pd, Mapping) and pool.get("engine", "vllm") == "vllm":
            out[int(pd.get("side_channel_port", NIXL_SIDE_CHANNEL_BASE)) + i] = \
                f"replica {i} NIXL side channel"
    return out


def kv_event_endpoints(pool: Mapping[str, Any], index: int, host: str) -> dict[str, str]:
    """Where a subscriber on another host connects for replica ``index``: ``{"endpoint",
    "replay", "topic"}`` with the bind wildcard replaced by ``host`` (the advertised
    host of the replica's URL); empty when the pool publishes no KV events."""
    if not (pool.get("options") or {}).get("kv_events"):
        return {}
    cfg = kv_events_config(pool, index)
    if cfg["publisher"] != "zmq":
        return {}
    return {"endpoint": cfg["endpoint"].replace("*", host),
            "replay": cfg["replay_endpoint"].replace("*", host), "topic": cfg["topic"]}


def _spec_config(spec: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"method": spec["method"],
                           "num_speculative_tokens": spec["num_speculative_tokens"]}
    for key in ("model", "num_speculative_tokens_per_batch_size", "prompt_lookup_min",
                "prompt_lookup_max", "draft_tensor_parallel_size"):
        if spec.get(key) is not None:
            out[key] = spec[key]
    return out


def _reference(pool: Mapping[str, Any], o: dict, index: int, host: str,
               python: str) -> tuple[list[str], dict]:
    argv = [python, "-m", "app.engine", "--model", pool["model"],
            "--served-model-name", _served_name(pool), "--host", host,
            "--port", str(replica_port(pool, index)),
            "--max-prefix-tokens", str(o.get("max_prefix_tokens", 32768))]
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if o.get("threads"):
        argv += ["--threads", str(o["threads"])]
    if o.get("max_model_len"):
        argv += ["--max-model-len", str(o["max_model_len"])]
    lora = o.get("lora")
    if lora is not None:
        argv += ["--max-loras", str(lora.get("max_loras", 4))]
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if o.get("kv_events"):
        argv += ["--kv-events-config", _json(kv_events_config(pool, index))]
    if o.get("enable_prompt_tokens_details", True):
        argv.append("--enable-prompt-tokens-details")
    return argv, env
