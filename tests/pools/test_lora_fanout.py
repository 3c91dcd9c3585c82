"""LoRA hot-load on every replica of a pool, with a result per replica."""
from __future__ import annotations

import httpx

from tests.engine.conftest import EngineProcess, free_port
from tests.engine.test_lora import PROMPT, _train_adapter
from workers.pools.lora import load_everywhere, unload_everywhere


def test_adapter_loads_on_each_replica_and_a_dead_one_is_reported(tiny_model_dir, tmp_path):
    adapter = _train_adapter(tiny_model_dir, tmp_path / "bananas")
    engines = [EngineProcess(str(tiny_model_dir), "tiny", tmp_path / f"e{i}.log", lora=True)
               for i in range(2)]
    try:
        for e in engines:
            e.wait_healthy()
        dead = f"http://127.0.0.1:{free_port()}"
        replicas = [(1, engines[0].url), (2, engines[1].url), (3, dead)]
        results = load_everywhere(replicas, "bananas", str(adapter), timeout_s=60)
        assert results[1]["ok"] and results[2]["ok"]
        assert not results[3]["ok"] and results[3]["status"] is None
        for e in engines:
            out = e.chat(PROMPT, model="bananas", max_tokens=8).json()
            assert "banana" in out["choices"][0]["message"]["content"]
        # loading again is idempotent: already loaded counts as success
        assert all(r["ok"] for r in load_everywhere(replicas[:2], "bananas", str(adapter)).values())
        gone = unload_everywhere(replicas[:2], "bananas")
        assert all(r["ok"] for r in gone.values())
        assert httpx.post(f"{engines[0].url}/v1/chat/completions", json={
            "model": "bananas", "messages": [{"role": "user", "content": "x"}]}).status_code == 404
    finally:
        for e in engines:
            e.stop()
