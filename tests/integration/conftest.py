"""Fixtures that join the gateway's (gateway process, fake frontier) with the engine's
(the CPU reference engine serving a tiny random Llama with the SmolLM2 tokenizer)."""
from __future__ import annotations

import pytest

from tests.engine.conftest import EngineProcess, tiny_model  # noqa: F401


@pytest.fixture(scope="module")
def engine(tiny_model, tmp_path_factory):  # noqa: F811
    """Serves the name the gateway's test pool publishes (``tiny-served``)."""
    eng = EngineProcess(str(tiny_model), "tiny-served",
                        tmp_path_factory.mktemp("log") / "engine.log")
    try:
        eng.wait_healthy()
        yield eng
    finally:
        eng.stop()
