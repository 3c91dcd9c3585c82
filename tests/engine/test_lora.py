"""LoRA hot-load through vLLM's endpoints: an adapter trained here changes the output."""
from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.engine.conftest import EngineProcess

PROMPT = "what fruit?"


def _train_adapter(base: Path, out: Path) -> Path:
    """A few optimizer steps teaching the tiny model to answer PROMPT with bananas."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj"], lora_dropout=0.0))
    prompt = tok.apply_chat_template([{"role": "user", "content": PROMPT}],
                                     add_generation_prompt=True, tokenize=False)
    p_ids = tok.encode(prompt, add_special_tokens=False)
    ids = torch.tensor([p_ids + tok.encode(" banana" * 8, add_special_tokens=False)])
    labels = ids.clone()
    labels[0, :len(p_ids)] = -100
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-2)
    torch.manual_seed(0)
    model.train()
    for _ in range(30):
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def adapter(tiny_model, tmp_path_factory) -> Path:
    return _train_adapter(tiny_model, tmp_path_factory.mktemp("lora") / "bananas")


def test_hot_loaded_adapter_changes_output(tiny_engine, adapter):
    base = tiny_engine.chat(PROMPT, max_tokens=8).json()["choices"][0]["message"]["content"]
    r = httpx.post(f"{tiny_engine.url}/v1/load_lora_adapter",
                   json={"lora_name": "bananas", "lora_path": str(adapter)}, timeout=60)
    assert r.status_code == 200, r.text
    ids = [m["id"] for m in httpx.get(f"{tiny_engine.url}/v1/models").json()["data"]]
    assert "bananas" in ids
    tuned = tiny_engine.chat(PROMPT, model="bananas", max_tokens=8).json()
    assert tuned["model"] == "bananas"
    assert "banana" in tuned["choices"][0]["message"]["content"]
    assert tuned["choices"][0]["message"]["content"] != base
    # the base model is untouched while the adapter is loaded
    again = tiny_engine.chat(PROMPT, max_tokens=8).json()["choices"][0]["message"]["content"]
    assert again == base
    dup = httpx.post(f"{tiny_engine.url}/v1/load_lora_adapter",
                     json={"lora_name": "bananas", "lora_path": str(adapter)}, timeout=60)
    assert dup.status_code == 400
    r = httpx.post(f"{tiny_engine.url}/v1/unload_lora_adapter", json={"lora_name": "bananas"})
    assert r.status_code == 200
    assert tiny_engine.chat(PROMPT, model="bananas").status_code == 404
    assert httpx.post(f"{tiny_engine.url}/v1/unload_lora_adapter",
                      json={"lora_name": "bananas"}).status_code == 404
    after = tiny_engine.chat(PROMPT, max_tokens=8).json()["choices"][0]["message"]["content"]
    assert after == base


def test_bad_adapter_path_is_rejected(tiny_engine, tmp_path):
    r = httpx.post(f"{tiny_engine.url}/v1/load_lora_adapter",
                   json={"lora_name": "ghost", "lora_path": str(tmp_path / "none")})
    assert r.status_code == 400


def test_runtime_lora_endpoints_need_the_vllm_env_flag(tiny_model, adapter, tmp_path):
    eng = EngineProcess(str(tiny_model), "tiny", tmp_path / "e.log", lora=False)
    try:
        eng.wait_healthy()
        r = httpx.post(f"{eng.url}/v1/load_lora_adapter",
                       json={"lora_name": "bananas", "lora_path": str(adapter)})
        assert r.status_code == 404
    finally:
        eng.stop()


def test_health_is_503_when_the_engine_cannot_load(tmp_path):
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{}")
    eng = EngineProcess(str(tmp_path / "broken"), "broken", tmp_path / "e.log")
    try:
        import time
        deadline = time.monotonic() + 60
        status = None
        while time.monotonic() < deadline:
            try:
                resp = httpx.get(f"{eng.url}/health", timeout=2)
                status = resp.status_code
                if status == 503 and "load failed" in resp.text:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        assert status == 503
        assert "load failed" in resp.text
        chat = httpx.post(f"{eng.url}/v1/chat/completions",
                          json={"messages": [{"role": "user", "content": "x"}]})
        assert chat.status_code == 503
    finally:
        eng.stop()
