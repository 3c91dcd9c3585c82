"""``python -m app.engine --model smollm2 --served-model-name NAME --port N``"""
from __future__ import annotations

import argparse
import logging
import os
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m app.engine",
                                description="Sluice CPU reference engine (vLLM's HTTP API)")
    p.add_argument("--model", default="smollm2", help="'smollm2' or a local HF folder")
    p.add_argument("--served-model-name", default="")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8500)
    p.add_argument("--max-prefix-tokens", type=int, default=32768,
                   help="token budget of the prefix KV cache")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--max-loras", type=int, default=4)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--enable-prompt-tokens-details", action="store_true")
    p.add_argument("--kv-events-config", default="",
                   help="vLLM's JSON: publish KV-cache events over ZMQ (app.engine.kv_events)")
    p.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="tool_choice 'auto' (needs --tool-call-parser), as in vLLM")
    p.add_argument("--tool-call-parser", default="", choices=["", "hermes"],
                   help="how generated text becomes tool calls (hermes: <tool_call>{json})")
    return p.parse_args(argv)


def build_app(args: argparse.Namespace):
    from app.engine.core import Engine
    from app.engine.model import resolve_model_path
    from app.engine.server import ServerOptions, create_app
    name = args.served_model_name or args.model

    def load() -> Engine:
        if args.threads:
            import torch
            torch.set_num_threads(args.threads)
        return Engine(resolve_model_path(args.model), name,
                      max_prefix_tokens=args.max_prefix_tokens, block_size=args.block_size,
                      max_model_len=args.max_model_len, kv_events=_kv_events(args, name))
    opts = ServerOptions(served_model_name=name,
                         enable_prompt_tokens_details=args.enable_prompt_tokens_details,
                         max_loras=args.max_loras,
                         enable_auto_tool_choice=args.enable_auto_tool_choice,
                         tool_call_parser=args.tool_call_parser)
    return create_app(load, opts)


def _kv_events(args: argparse.Namespace, name: str):
    from app.engine import kv_events
    cfg = kv_events.parse_config(args.kv_events_config)
    if cfg is None:
        return None
    return kv_events.CacheEvents(kv_events.ZmqEventPublisher.from_config(cfg), args.block_size,
                                 name)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.INFO)
    args = parse_args(argv)
    import uvicorn
    uvicorn.run(build_app(args), host=args.host, port=args.port, log_level="warning",
                access_log=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
