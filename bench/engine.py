"""Reference engine figures with SmolLM2-135M on this CPU: decode tokens/s, and TTFT
for a request whose 1,000-token shared prefix misses vs hits the prefix KV cache.

    .venv/bin/python bench/engine.py [--model smollm2] [--threads 1] [--runs 3]

Starts the engine as a real HTTP server on a free 127.0.0.1 port, streams each request
and times the first content chunk. A miss is forced with a fresh ``cache_salt`` (its own
cache namespace), so both cases run the same tokens.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prefix(tokenizer, n_tokens: int) -> str:
    words = ("Policy clause {i}: refunds for SKU-{i:04d} follow the standard terms; "
             "escalate disputes to tier two support. ")
    text, i = "", 0
    while len(tokenizer.encode(text)) < n_tokens:
        text += words.format(i=i)
        i += 1
    ids = tokenizer.encode(text)[:n_tokens]
    return tokenizer.decode(ids)


def _stream(url: str, body: dict) -> tuple[float, float, int, dict]:
    """(ttft_s, total_s, content_chunks, usage)."""
    t0 = time.perf_counter()
    ttft, chunks, usage = None, 0, {}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if data.get("usage"):
                usage = data["usage"]
            for c in data.get("choices", []):
                if c["delta"].get("content"):
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    chunks += 1
    return ttft or 0.0, time.perf_counter() - t0, chunks, usage


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads; 1 avoids OpenMP spin contention on a shared box")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--prefix-tokens", type=int, default=1000)
    ap.add_argument("--gen-tokens", type=int, default=64)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoTokenizer

    from app.engine.model import resolve_model_path
    path = resolve_model_path(args.model)
    tok = AutoTokenizer.from_pretrained(path)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "app.engine", "--model", str(path),
                             "--served-model-name", "bench", "--port", str(port),
                             "--threads", str(args.threads), "--enable-prompt-tokens-details"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        else:
            raise SystemExit("engine did not start")
        system = _prefix(tok, args.prefix_tokens)

        def body(question: str, salt: str, max_tokens: int) -> dict:
            return {"model": "bench", "temperature": 0, "max_tokens": max_tokens, "stream": True,
                    "stream_options": {"include_usage": True}, "cache_salt": salt,
                    "messages": [{"role": "system", "content": system},
                                 {"role": "user", "content": question}]}

        _stream(url, body("warm-up", "warmup", 4))
        cold, warm, cached = [], [], []
        for i in range(args.runs):
            salt = uuid.uuid4().hex
            ttft_miss, _, _, u_miss = _stream(url, body(f"Question {i}: what applies?", salt, 1))
            ttft_hit, _, _, u_hit = _stream(url, body(f"Another {i}: and now?", salt, 1))
            assert u_miss["prompt_tokens_details"]["cached_tokens"] == 0
            cold.append(ttft_miss)
            warm.append(ttft_hit)
            cached.append(u_hit["prompt_tokens_details"]["cached_tokens"])
            print(f"run {i}: TTFT miss {ttft_miss * 1000:.0f} ms, hit {ttft_hit * 1000:.0f} ms "
                  f"({cached[-1]} cached tokens)", flush=True)
        rates = []
        for i in range(args.runs):
            ttft, total, chunks, usage = _stream(
                url, {"model": "bench", "temperature": 0, "max_tokens": args.gen_tokens,
                      "stream": True, "stream_options": {"include_usage": True},
                      "messages": [{"role": "user", "content": f"Write a long story about a "
                                                               f"lighthouse keeper, part {i}."}]})
            n = usage.get("completion_tokens", chunks)
            if total > ttft and n > 1:
                rates.append((n - 1) / (total - ttft))
                print(f"decode run {i}: {n} tokens, {rates[-1]:.1f} tokens/s", flush=True)
        prompt_tokens = u_hit["prompt_tokens"]
        print(f"model: {path.name}  threads: {args.threads}  runs: {args.runs}")
        print(f"prompt: {prompt_tokens} tokens with a {args.prefix_tokens}-token shared prefix; "
              f"cached on hit: {statistics.median(cached):.0f} tokens")
        print(f"TTFT prefix-cache miss: median {statistics.median(cold) * 1000:.1f} ms  "
              f"({', '.join(f'{x * 1000:.0f}' for x in cold)})")
        print(f"TTFT prefix-cache hit:  median {statistics.median(warm) * 1000:.1f} ms  "
              f"({', '.join(f'{x * 1000:.0f}' for x in warm)})")
        print(f"TTFT ratio miss/hit: {statistics.median(cold) / statistics.median(warm):.1f}x")
        if rates:
            print(f"decode: median {statistics.median(rates):.1f} tokens/s "
                  f"({args.gen_tokens} max tokens, greedy, one request at a time)")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
