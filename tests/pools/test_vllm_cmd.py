"""Golden command lines for the seed's three serving configurations."""
from __future__ import annotations

import json

import pytest

from workers.pools.vllm_cmd import build_command, kv_event_endpoints, validate_options

TIER1 = {"name": "tier1-8b", "engine": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct",
         "served_model_name": "llama-3.1-8b", "base_port": 8000, "gpus_per_replica": 1,
         "options": {"quantization": "fp8", "kv_cache_dtype": "fp8",
                     "gpu_memory_utilization": 0.92, "max_num_seqs": 256,
                     "prefix_caching_hash_algo": "sha256",
                     "lora": {"max_loras": 8, "max_lora_rank": 64,
                              "modules": {"revops-extract": "/adapters/revops-v3"}}}}

TIER2 = {"name": "tier2-70b", "engine": "vllm", "model": "meta-llama/Llama-3.3-70B-Instruct",
         "served_model_name": "llama-3.3-70b", "base_port": 8100, "gpus_per_replica": 4,
         "options": {"quantization": "fp8", "kv_cache_dtype": "fp8", "max_num_seqs": 128,
                     "speculative": {"method": "eagle3",
                                     "model": "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B",
                                     "num_speculative_tokens": 5,
                                     "num_speculative_tokens_per_batch_size": [
                                         [1, 8, 5], [9, 32, 3], [33, 128, 1]]}}}


def test_tier1_8b_fp8_multi_lora():
    argv, env = build_command(TIER1, 1)
    assert argv == [
        "vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct",
        "--served-model-name", "llama-3.1-8b", "--host", "127.0.0.1", "--port", "8001",
        "--quantization", "fp8", "--kv-cache-dtype", "fp8",
        "--gpu-memory-utilization", "0.92", "--max-num-seqs", "256",
        "--enable-prefix-caching", "--prefix-caching-hash-algo", "sha256",
        "--enable-lora", "--max-loras", "8", "--max-lora-rank", "64",
        "--lora-modules", "revops-extract=/adapters/revops-v3",
        "--enable-prompt-tokens-details",
        "--enable-auto-tool-choice", "--tool-call-parser", "llama3_json"]
    assert env == {"CUDA_VISIBLE_DEVICES": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}


def test_tier2_70b_fp8_eagle3_dynamic_depth():
    argv, env = build_command(TIER2, 0, host="0.0.0.0")
    assert argv == [
        "vllm", "serve", "meta-llama/Llama-3.3-70B-Instruct",
        "--served-model-name", "llama-3.3-70b", "--host", "0.0.0.0", "--port", "8100",
        "--tensor-parallel-size", "4", "--quantization", "fp8", "--kv-cache-dtype", "fp8",
        "--max-num-seqs", "128", "--enable-prefix-caching",
        "--speculative-config",
        '{"method":"eagle3","model":"yuhuili/EAGLE3-LLaMA3.3-Instruct-70B",'
        '"num_speculative_tokens":5,'
        '"num_speculative_tokens_per_batch_size":[[1,8,5],[9,32,3],[33,128,1]]}',
        "--enable-prompt-tokens-details",
        "--enable-auto-tool-choice", "--tool-call-parser", "llama3_json"]
    assert env == {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    # replica 1 takes the next four GPUs
    assert build_command(TIER2, 1)[1]["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"


def test_tier2_awq_variant_and_ngram():
    pool = {**TIER2, "options": {"quantization": "awq_marlin", "prefix_caching": False,
                                 "speculative": {"method": "ngram", "num_speculative_tokens": 4,
                                                 "prompt_lookup_max": 4}}}
    argv, _ = build_command(pool, 0)
    assert argv[argv.index("--quantization") + 1] == "awq_marlin"
    assert "--no-enable-prefix-caching" in argv and "--enable-prefix-caching" not in argv
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}


@pytest.mark.parametrize("role,index,port,side", [("prefill", 0, "8200", "5600"),
                                                  ("decode", 1, "8301", "5611")])
def test_prefill_decode_split_pair(role, index, port, side):
    pool = {"name": f"tier2-{role}", "engine": "vllm", "model": "meta-llama/Llama-3.3-70B-Instruct",
            "served_model_name": "llama-3.3-70b", "gpus_per_replica": 2,
            "base_port": 8200 if role == "prefill" else 8300,
            "options": {"quantization": "fp8", "gpu_memory_utilization": 0.9,
                        "disaggregation": {"role": role, "connector": "NixlConnector",
                                           "side_channel_port": 5600 if role == "prefill"
                                           else 5610},
                        "kv_events": True}}
    argv, env = build_command(pool, index)
    assert argv == [
        "vllm", "serve", "meta-llama/Llama-3.3-70B-Instruct",
        "--served-model-name", "llama-3.3-70b", "--host", "127.0.0.1", "--port", port,
        "--tensor-parallel-size", "2", "--quantization", "fp8",
        "--gpu-memory-utilization", "0.9", "--enable-prefix-caching",
        "--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both"}',
        "--kv-events-config",
        '{"enable_kv_cache_events":true,"endpoint":"tcp://*:%d","publisher":"zmq",'
        '"replay_endpoint":"tcp://*:%d","topic":"kv@llama-3.3-70b-%d"}'
        % (5557 + index, 5657 + index, index),
        "--enable-prompt-tokens-details",
        "--enable-auto-tool-choice", "--tool-call-parser", "llama3_json"]
    assert env == {"CUDA_VISIBLE_DEVICES": "0,1" if index == 0 else "2,3",
                   "VLLM_NIXL_SIDE_CHANNEL_PORT": side,
                   "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1"}


def test_reference_engine_pool():
    pool = {"name": "tier1-small", "engine": "reference", "model": "smollm2",
            "served_model_name": "smollm2-135m-instruct", "base_port": 8500,
            "options": {"lora": {"max_loras": 2}, "threads": 1, "max_prefix_tokens": 8192}}
    argv, env = build_command(pool, 1, python="/venv/bin/python")
    assert argv == ["/venv/bin/python", "-m", "app.engine", "--model", "smollm2",
                    "--served-model-name", "smollm2-135m-instruct", "--host", "127.0.0.1",
                    "--port", "8501", "--max-prefix-tokens", "8192", "--threads", "1",
                    "--max-loras", "2", "--enable-prompt-tokens-details",
                    "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    assert env == {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                   "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}


def test_invalid_options_are_refused():
    assert validate_options(TIER1["options"]) == {}
    bad = {"quantization": "int3", "speculative": {"method": "eagle3",
                                                   "num_speculative_tokens": 5,
                                                   "num_speculative_tokens_per_batch_size":
                                                       [[1, 8, 7]]},
           "disaggregation": {"role": "both"}, "gpu_memory_utilization": 1.5}
    errors = validate_options(bad)
    assert set(errors) == {"quantization", "speculative", "disaggregation",
                           "gpu_memory_utilization"}
    with pytest.raises(ValueError):
        build_command({"name": "x", "engine": "vllm", "model": "m", "options": bad}, 0)


def test_tool_call_parser_follows_the_model_family_unless_set():
    """vLLM serves tool_choice auto only with a parser for the model's call format."""
    def flags(model: str, **options) -> list[str]:
        argv, _ = build_command({"name": "p", "engine": "vllm", "model": model,
                                 "options": options}, 0)
        return argv[argv.index("--enable-auto-tool-choice"):][:3] \
            if "--enable-auto-tool-choice" in argv else []
    assert flags("Qwen/Qwen2.5-7B-Instruct") == [
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    assert flags("mistralai/Mistral-Small-Instruct")[2] == "mistral"
    assert flags("some-org/unknown-model") == []
    assert flags("some-org/unknown-model", tool_call_parser="pythonic")[2] == "pythonic"
    assert flags("meta-llama/Llama-3.1-8B-Instruct", tool_call_parser=False) == []
    assert validate_options({"tool_call_parser": "my_plugin"}) != {}


def test_reference_engine_publishes_kv_events_like_vllm():
    pool = {"name": "tier1-small", "engine": "reference", "model": "smollm2",
            "served_model_name": "smollm2-135m-instruct", "base_port": 8500,
            "options": {"kv_events": True}}
    argv, _ = build_command(pool, 2, python="/venv/bin/python")
    # the very JSON vLLM gets (test_prefill_decode_split_pair), one port pair per replica
    at = argv.index("--kv-events-config")
    assert argv[at + 1] == ('{"enable_kv_cache_events":true,"endpoint":"tcp://*:5559",'
                            '"publisher":"zmq","replay_endpoint":"tcp://*:5659",'
                            '"topic":"kv@smollm2-135m-instruct-2"}')
    assert argv[:at] == ["/venv/bin/python", "-m", "app.engine", "--model", "smollm2",
                         "--served-model-name", "smollm2-135m-instruct", "--host",
                         "127.0.0.1", "--port", "8502", "--max-prefix-tokens", "32768"]
    assert kv_event_endpoints(pool, 2, "10.0.0.5") == {
        "endpoint": "tcp://10.0.0.5:5559", "replay": "tcp://10.0.0.5:5659",
        "topic": "kv@smollm2-135m-instruct-2"}
    assert kv_event_endpoints({**pool, "options": {}}, 2, "10.0.0.5") == {}


def test_every_replica_binds_kv_ports_of_its_own_and_node_ports_lists_them():
    from workers.pools.vllm_cmd import kv_events_config, node_ports
    pool = {"name": "p", "engine": "reference", "model": "smollm2", "base_port": 8500,
            "desired_replicas": 2, "options": {"kv_events": True}}
    assert node_ports(pool) == {
        8500: "replica 0 HTTP", 5557: "replica 0 KV events", 5657: "replica 0 KV replay",
        8501: "replica 1 HTTP", 5558: "replica 1 KV events", 5658: "replica 1 KV replay"}
    # a second pool on the node moves its range with kv_events.port
    moved = {**pool, "base_port": 8510, "options": {"kv_events": {"port": 5567}}}
    assert set(node_ports(moved)) == {8510, 8511, 5567, 5568, 5667, 5668}
    # an explicit endpoint is replica 0's: replica 1 binds the next port (it bound the
    # same one, and the second engine's PUB socket failed)
    explicit = {**pool, "options": {"kv_events": {"endpoint": "tcp://*:7000"}}}
    assert [(c["endpoint"], c["replay_endpoint"]) for c in
            (kv_events_config(explicit, i) for i in range(2))] == [
        ("tcp://*:7000", "tcp://*:7100"), ("tcp://*:7001", "tcp://*:7101")]
    assert set(node_ports({**pool, "options": {}})) == {8500, 8501}
    assert validate_options({"kv_events": {"port": 80}}, "reference") != {}
