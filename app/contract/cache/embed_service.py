"""A standalone embedding server speaking Text Embeddings Inference's HTTP API.

    python -m app.contract.cache.embed_service --host 0.0.0.0 --port 8090

Gateways configured with ``EMBEDDING_BACKEND=service`` and ``EMBEDDING_URL`` send their
texts here instead of running MiniLM in their own processes. The server runs this process's
configured encoder (``EMBEDDING_*`` config, ``auto`` by default) behind the micro-batcher, so
texts from every gateway's concurrent requests share encoder calls.

Endpoints (TEI's): ``POST /embed`` ``{"inputs": str | [str], "normalize": bool}`` -> list of
vectors; ``GET /health``; ``GET /info``. Errors are TEI-shaped: ``{"error", "error_type"}``.
"""
from __future__ import annotations

import argparse
import asyncio
from typing import Any

import numpy as np
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app.contract.cache import embedding

MAX_INPUTS = 256          # texts per request (TEI's --max-client-batch-size default is 32)
MAX_BODY_BYTES = 8 << 20


def _error(status: int, message: str, kind: str = "Validation") -> Response:
    return Response(orjson.dumps({"error": message, "error_type": kind}), status_code=status,
                    media_type="application/json")


async def embed(request: Request) -> Response:
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        return _error(413, "payload too large")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _error(422, "body is not JSON")
    inputs = body.get("inputs") if isinstance(body, dict) else None
    if isinstance(inputs, str):
        inputs = [inputs]
    if not isinstance(inputs, list) or not inputs or not all(isinstance(t, str) for t in inputs):
        return _error(422, "`inputs` must be a string or a non-empty list of strings")
    if len(inputs) > MAX_INPUTS:
        return _error(413, f"batch size {len(inputs)} > maximum allowed batch size {MAX_INPUTS}")
    try:
        vecs = await asyncio.gather(*(embedding.embed_async(t, owner=request.client)
                                      for t in inputs))
    except Exception as exc:  # noqa: BLE001 - the model failed on these texts
        return _error(424, f"{type(exc).__name__}: {exc}", "Backend")
    out = np.stack(vecs)  # unit length whatever ``normalize`` says: MiniLM's Normalize module
    return Response(orjson.dumps(out, option=orjson.OPT_SERIALIZE_NUMPY),
                    media_type="application/json")


async def health(_: Request) -> Response:
    return Response(b"", status_code=200)


async def info(_: Request) -> Response:
    settings = embedding.current_settings()
    return Response(orjson.dumps({"model_id": "sentence-transformers/all-MiniLM-L6-v2",
                                  "model_type": {"embedding": {"pooling": "mean"}},
                                  "max_input_length": 256,
                                  "max_client_batch_size": MAX_INPUTS,
                                  "backend": settings["backend"]}),
                    media_type="application/json")


def create_app(config: dict[str, Any] | None = None) -> Starlette:
    if config is None:
        from config import load_config
        config = load_config()
    if config["EMBEDDING_BACKEND"] == "service":
        raise SystemExit("the embedding service runs the model itself: EMBEDDING_BACKEND "
                         "must not be 'service' here")
    embedding.configure_from(config)
    embedding.get_encoder()  # load (and export on first use) before taking traffic
    return Starlette(routes=[Route("/embed", embed, methods=["POST"]),
                             Route("/health", health, methods=["GET"]),
                             Route("/info", info, methods=["GET"])])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8090)
    args = ap.parse_args()
    import uvicorn
    uvicorn.run(create_app(), host=args.host, port=args.port, log_level="warning",
                access_log=False)


if __name__ == "__main__":
    main()
