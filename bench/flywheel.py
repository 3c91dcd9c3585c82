"""LoRA flywheel benchmark: what a distilled adapter buys on one workflow, on this CPU.

The workflow (synthetic, stated): a templated order extraction. System prompt "Extract
the order as JSON with keys order_id, qty, item, customer."; user "Order #A123: 3 x blue
widget for Alice" with random ids, quantities (1-20), items (7 colours x 7 nouns) and
customers (10 names); the frontier answer is the exact compact JSON of those values
(response_format json_object). Traces are split as a frozen dataset splits them
(app.adapters.datasets.split_of, sha256 of the request id).

Training and evaluation are the task's own code (app.adapters.training.fit_lora,
app.adapters.evaluation.evaluate_offline): a PEFT LoRA on SmolLM2-135M-Instruct (float32,
CPU), loss on the answer tokens only; greedy generation on the held-out prompts by the
base model and by base + adapter; concordance = all JSON fields equal to the frontier's
(Wilson 95% interval). Peak RSS is this process's (resource.getrusage).

Hot-load: the reference engine (``python -m app.engine``) started per replica on a free
port with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True; POST /v1/load_lora_adapter timed, then
one held-out prompt sent with model=<lora_name> (the served answer must be the one the
in-process evaluation produced), then unloaded; repeated ``--loads`` times per replica.

Cost per 1k requests at the measured tokens: before = every request on the frontier
(tier-3 seed price, input = output); after = on tier 1 with the adapter (tier-1 seed
price: the real-time estimate budgets count; FinOps charges the pool's GPU-hours once a
GPU rate exists). Prompt tokens counted with the SmolLM2 tokenizer on the chat template.

    .venv/bin/python bench/flywheel.py [--n 100] [--heldout 0.25] [--replicas 2]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from app.adapters.datasets import HELDOUT, split_of  # noqa: E402
from app.adapters.evaluation import chat_prompt, evaluate_offline  # noqa: E402
from app.adapters.training import DEFAULT_HYPERPARAMS, artifact_sha256, fit_lora  # noqa: E402
from app.commands import SEED_TIERS  # noqa: E402
from app.engine.model import ensure_smollm2  # noqa: E402

SYSTEM = "Extract the order as JSON with keys order_id, qty, item, customer."
COLORS = ["blue", "red", "green", "black", "white", "yellow", "silver"]
ITEMS = ["widget", "gadget", "bolt", "valve", "bracket", "sprocket", "hinge"]
NAMES = ["Alice", "Bob", "Carol", "Dmitri", "Erin", "Farah", "Gustavo", "Hana", "Ivan", "Julia"]


def traces(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        oid = f"{rng.choice('ABCDEFGH')}{rng.randint(100, 999)}"
        qty, item = rng.randint(1, 20), f"{rng.choice(COLORS)} {rng.choice(ITEMS)}"
        who = rng.choice(NAMES)
        ask = f"Order #{oid}: {qty} x {item} for {who}"
        out.append({"request_id": f"req_bench_{seed}_{i:04d}", "response_format":
                    {"type": "json_object"},
                    "messages": [{"role": "system", "content": SYSTEM},
                                 {"role": "user", "content": ask}],
                    "answer": json.dumps({"order_id": oid, "qty": qty, "item": item,
                                          "customer": who}, separators=(",", ":"))})
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hot_load(model: Path, adapter: Path, record: dict, expected: str, loads: int,
             replica: int) -> dict:
    """Start one engine replica; time load_lora_adapter ``loads`` times (unloading between)."""
    port, log = _free_port(), tempfile.NamedTemporaryFile(prefix="flywheel-engine-", delete=False)
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    proc = subprocess.Popen([sys.executable, "-m", "app.engine", "--model", str(model),
                             "--served-model-name", f"t1-{replica}", "--port", str(port),
                             "--threads", "1"], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        t0 = time.perf_counter()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise SystemExit(f"engine exited; log in {log.name}")
            time.sleep(0.2)
        else:
            raise SystemExit(f"engine did not start; log in {log.name}")
        start_s = time.perf_counter() - t0
        times, served = [], None
        for i in range(loads):
            name = f"wf-bench-{i}"
            t = time.perf_counter()
            r = httpx.post(f"{url}/v1/load_lora_adapter",
                           json={"lora_name": name, "lora_path": str(adapter)}, timeout=120)
            times.append((time.perf_counter() - t) * 1000)
            r.raise_for_status()
            if served is None:
                body = {"model": name, "messages": record["messages"], "temperature": 0,
                        "max_tokens": 64}
                served = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300) \
                    .json()["choices"][0]["message"]["content"].strip()
            httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": name},
                       timeout=60).raise_for_status()
        return {"start_s": start_s, "load_ms": times, "served": served,
                "served_matches": served == expected}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def per_1k(prompt: float, completion: float, price_per_m: Decimal) -> float:
    return float(Decimal(str(prompt + completion)) * 1000 * price_per_m / Decimal(1_000_000))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100, help="traces (train + held out)")
    ap.add_argument("--heldout", type=float, default=0.25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--loads", type=int, default=3, help="hot-loads timed per replica")
    args = ap.parse_args()
    import torch
    from transformers import AutoTokenizer
    torch.set_num_threads(min(2, os.cpu_count() or 1))

    model = ensure_smollm2()
    rows = traces(args.n, args.seed)
    train = [r for r in rows if split_of(r["request_id"], args.heldout) != HELDOUT]
    heldout = [r for r in rows if split_of(r["request_id"], args.heldout) == HELDOUT]
    hp = {**DEFAULT_HYPERPARAMS, "rank": args.rank, "alpha": 2 * args.rank, "lr": args.lr,
          "epochs": args.epochs, "batch_size": args.batch_size, "seed": args.seed}
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    losses: list[tuple[int, float]] = []
    with tempfile.TemporaryDirectory(prefix="flywheel-") as tmp:
        out = Path(tmp) / "adapter"
        out.mkdir()
        t0 = time.perf_counter()
        metrics = fit_lora(str(model), train, hp, out,
                           on_step=lambda s, n, loss: losses.append((s, loss)) or True)
        train_s = time.perf_counter() - t0
        rss_train = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        size_kb = sum(p.stat().st_size for p in out.iterdir()) / 1024
        sha = artifact_sha256(out)
        t0 = time.perf_counter()
        off = evaluate_offline(str(model), out, heldout, cap=256, batch=16)
        eval_s = time.perf_counter() - t0
        # what the adapter answered in-process for the first held-out prompt
        expected = off["samples"][0]["candidate"]
        loads = [hot_load(model, out, heldout[0], expected, args.loads, i)
                 for i in range(args.replicas)]

    tok = AutoTokenizer.from_pretrained(model)
    prompt_tokens = statistics.mean(len(tok.encode(chat_prompt(tok, r["messages"]),
                                                   add_special_tokens=False)) for r in heldout)
    ref_tokens = statistics.mean(len(tok.encode(r["answer"], add_special_tokens=False))
                                 for r in heldout)
    price = {t["rank"]: t["price"] for t in SEED_TIERS}
    before = per_1k(prompt_tokens, ref_tokens, price[3])
    after = per_1k(prompt_tokens, off["tokens"], price[1])

    print("\n\n".join(__doc__.split("\n\n")[1:5]) + "\n")
    print(f"traces: {len(rows)}: train {len(train)}, held out {len(heldout)} "
          f"(split {args.heldout:.0%} by request-id hash); model {model.name} on "
          f"{torch.get_num_threads()} CPU threads")
    print(f"hyperparameters: rank {hp['rank']} alpha {hp['alpha']:g} lr {hp['lr']:g} "
          f"epochs {hp['epochs']} batch {hp['batch_size']} targets "
          f"{','.join(hp['target_modules'])} -> {metrics['steps']} steps "
          f"(seed defaults: rank 32 alpha 64 lr 2e-4 epochs 1 batch 4)")
    shown = [losses[0], *losses[len(losses) // 4::max(1, len(losses) // 4)][:3], losses[-1]]
    print("loss: " + "  ".join(f"step {s} {v:.3f}" for s, v in shown))
    print(f"\nheld-out concordance with the frontier answer (all JSON fields equal), n={off['n']}:")
    print(f"  base SmolLM2-135M     {off['base_concordance']:7.1%}  95% CI "
          f"[{off['base_ci_low']:.1%}, {off['base_ci_high']:.1%}]  mean field score "
          f"{off['base_score']:.1%}  tokens {off['base_tokens']:.1f}")
    print(f"  base + LoRA adapter   {off['concordance']:7.1%}  95% CI "
          f"[{off['ci_low']:.1%}, {off['ci_high']:.1%}]  mean field score "
          f"{off['score']:.1%}  tokens {off['tokens']:.1f}")
    s = off["samples"][0]
    print(f"  e.g. {s['prompt']!r}\n       frontier {s['reference']}\n       adapter  "
          f"{s['candidate']}\n       base     {s['base'][:90]!r}")
    print(f"\ntraining: {train_s:.1f} s wall ({metrics['steps']} steps, "
          f"{train_s / metrics['steps']:.2f} s/step incl. model load); offline evaluation "
          f"{eval_s:.1f} s ({off['latency_ms']:.0f} ms/sample with the adapter, batched)")
    print(f"peak RSS: {rss_before:.0f} MB before training, {rss_train:.0f} MB after "
          f"(process peak)")
    print(f"artifact: {size_kb:.0f} KiB, sha256 {sha[:16]}...")
    print(f"\nhot-load per replica (reference engine, {args.loads} loads each):")
    for i, ld in enumerate(loads):
        each = ", ".join(f"{x:.0f}" for x in ld["load_ms"])
        print(f"  replica {i}: engine up in {ld['start_s']:.1f} s; load_lora_adapter median "
              f"{statistics.median(ld['load_ms']):.0f} ms ({each}); served answer {'==' if ld['served_matches'] else '!='} in-process answer")
    print(f"\ncost per 1k requests at {prompt_tokens:.0f} prompt + {ref_tokens:.0f} completion "
          f"tokens (frontier) / {off['tokens']:.0f} (adapter):")
    print(f"  before: frontier tier-3 at ${price[3]}/1M   ${before:.4f}")
    print(f"  after:  tier-1 + adapter at ${price[1]}/1M  ${after:.4f}   "
          f"({1 - after / before:.1%} less)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
