"""The real SmolLM2-135M-Instruct, through the OpenAI client."""
from __future__ import annotations

import json

import pytest

from tests.engine.conftest import EngineProcess


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    from app.engine.model import ensure_smollm2
    ensure_smollm2()
    eng = EngineProcess("smollm2", "smollm2-135m-instruct",
                        tmp_path_factory.mktemp("smol") / "engine.log")
    try:
        eng.wait_healthy(timeout_s=240)
        yield eng
    finally:
        eng.stop()


@pytest.mark.slow
def test_smollm2_answers_through_the_openai_client(smol):
    from openai import OpenAI
    client = OpenAI(base_url=f"{smol.url}/v1", api_key="unused", max_retries=0)
    out = client.chat.completions.create(
        model="smollm2-135m-instruct", temperature=0, max_tokens=20, logprobs=True,
        top_logprobs=2, messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert "Paris" in out.choices[0].message.content
    assert len(out.choices[0].logprobs.content[0].top_logprobs) == 2
    stream = client.chat.completions.create(
        model="smollm2-135m-instruct", temperature=0, max_tokens=20, stream=True,
        messages=[{"role": "user", "content": "What is the capital of France?"}])
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == out.choices[0].message.content


@pytest.mark.slow
def test_smollm2_json_schema(smol):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "country": {"type": "string", "maxLength": 20}},
              "required": ["city", "country"], "additionalProperties": False}
    r = smol.chat("Name the capital of France as JSON with city and country.", max_tokens=40,
                  response_format={"type": "json_schema",
                                   "json_schema": {"name": "c", "schema": schema}})
    data = json.loads(r.json()["choices"][0]["message"]["content"])
    assert set(data) == {"city", "country"} and "Paris" in data["city"]


LOAD = """
import sys
from app.engine.model import ensure_smollm2
from transformers import AutoModelForCausalLM, AutoTokenizer
path = ensure_smollm2()
AutoTokenizer.from_pretrained(path)
AutoModelForCausalLM.from_pretrained(path)
print("loaded", path)
"""


@pytest.mark.slow
def test_engines_starting_together_on_a_fresh_machine_convert_once(tmp_path):
    """Three processes that need SmolLM2 at once on an empty model cache (a pool's replicas
    on first start): one converts the GGUF, the others wait for it and load its folder.
    Each used to convert on its own and replace the folder, which broke another's load
    ("Couldn't instantiate the backend tokenizer", bench/replay.py on a fresh machine)."""
    import os
    import subprocess
    import sys
    env = {**os.environ, "SLUICE_MODEL_CACHE": str(tmp_path / "models"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", LOAD], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
        assert "loaded" in out
    folder = tmp_path / "models" / "smollm2-135m-instruct"
    assert sorted(x.name for x in (tmp_path / "models").iterdir()
                  if not x.name.startswith(".")) == [folder.name]   # no temp folder left
    assert (folder / "model.safetensors").exists()
