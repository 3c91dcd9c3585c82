"""Would an int8 MiniLM pay? Speed and the CD-28A drill, fp32 (shipped) vs int8 graphs.

    .venv/bin/pip install onnx        # quantize_dynamic needs it; the project does not
    HF_HUB_OFFLINE=1 .venv/bin/python bench/embedding_int8.py
    .venv/bin/pip uninstall -y onnx

Quantises the cached fp32 export (``app.contract.cache.encoders``) with onnxruntime's dynamic
quantisation, two ways (every op, per-tensor; MatMul only, per-channel), then for each graph:
CPU per text at batch 1 and 32 (same texts, one thread), the lowest cosine to the fp32 vectors,
and the drill (production CacheStore and keys, real Redis) on the sample and held-out pairs.
The issue's bar for shipping a faster graph: 0 false hits and >= 99% true paraphrase hits.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from app.cache.drill import read_pairs, run_cache_poisoning  # noqa: E402
from app.contract.cache import embedding, encoders  # noqa: E402

PAIRS = [ROOT / "app/cache/data/cache_pairs_sample.jsonl", ROOT / "tests/cache/data/pairs_heldout.jsonl"]


def cpu_per_text(enc, texts: list[str], batch: int) -> float:
    enc.encode(texts[:2])
    c0 = time.process_time()
    for j in range(0, len(texts), batch):
        enc.encode(texts[j:j + batch])
    return (time.process_time() - c0) / len(texts) * 1000


def main() -> None:
    import redis
    from onnxruntime.quantization import QuantType, quantize_dynamic
    mdir = encoders.model_dir()
    fp32_dir = encoders.cached_export(encoders.default_cache_dir(), mdir, embedding.get_model)
    tmp = Path(tempfile.mkdtemp(prefix="sluice-int8-"))
    quantize_dynamic(str(fp32_dir / "model.onnx"), str(tmp / "int8.onnx"),
                     weight_type=QuantType.QInt8)
    quantize_dynamic(str(fp32_dir / "model.onnx"), str(tmp / "int8pc.onnx"),
                     weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["MatMul"])
    graphs = {"fp32 (shipped)": fp32_dir / "model.onnx", "int8, all ops": tmp / "int8.onnx",
              "int8, MatMul per-channel": tmp / "int8pc.onnx"}
    texts = [f"Say hello to customer {i}, whose order is late." for i in range(128)]
    probe = [p["a"] for p in read_pairs(PAIRS[0].read_text().splitlines())][:200]
    client = redis.Redis.from_url(os.environ.get("SLUICE_REDIS_URL", "redis://127.0.0.1:6379/0"))
    ref = None
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; one onnxruntime thread")
    for name, path in graphs.items():
        enc = encoders.OnnxEncoder(path, mdir, threads=1)
        vecs = enc.encode(probe)
        ref = vecs if ref is None else ref
        size = path.stat().st_size / 2**20
        print(f"\n== {name}: {size:.0f} MiB; cpu per text batch 1 {cpu_per_text(enc, texts, 1):.2f} ms, "
              f"batch 32 {cpu_per_text(enc, texts, 32):.2f} ms; min cosine to fp32 "
              f"{float((vecs * ref).sum(axis=1).min()):.4f}")
        embedding._encoder = enc  # the drill embeds with this process's encoder
        for f in PAIRS:
            out = run_cache_poisoning(read_pairs(f.read_text().splitlines()), client, "benchint8")
            para = {k: f"{v['hits']}/{v['pairs']}" for k, v in out["by_kind"].items() if v["hits"]}
            print(f"   {f.name:28} false hits {out['false_hits']}, true hits {out['true_hits']} "
                  f"({out['true_hit_rate']:.2%}); hits by kind {para}")
    embedding._encoder = None


if __name__ == "__main__":
    main()
