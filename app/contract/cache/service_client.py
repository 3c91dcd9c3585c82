"""The ``service`` embedding backend: texts go to an embedding server over HTTP.

The server speaks Text Embeddings Inference's API (``POST /embed`` with
``{"inputs": [...], "normalize": true, "truncate": true}``, answered by one vector per
input); ``app.contract.cache.embed_service`` is such a server, and a TEI container serving
``sentence-transformers/all-MiniLM-L6-v2`` is another. The vectors must be that model's
(the cache threshold and the router's weights were learnt on them): a server answering with
another dimension is refused, and every vector is re-normalised here.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from app.contract.cache.encoders import DIM


class EmbeddingServiceError(RuntimeError):
    """The embedding service did not answer with one DIM-sized vector per text."""


class ServiceEncoder:
    name = "service"

    def __init__(self, url: str, timeout_s: float = 5.0) -> None:
        import httpx
        self.url = url.rstrip("/")
        # One pooled keep-alive connection set per process; the batcher calls from one thread.
        self.client = httpx.Client(timeout=timeout_s, limits=httpx.Limits(max_connections=8))

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        texts = list(texts)
        out = np.empty((len(texts), DIM), dtype=np.float32)
        for i in range(0, len(texts), batch_size):
            out[i:i + batch_size] = self._post(texts[i:i + batch_size])
        return out

    def _post(self, texts: list[str]) -> np.ndarray:
        try:
            resp = self.client.post(f"{self.url}/embed",
                                    json={"inputs": texts, "normalize": True, "truncate": True})
        except Exception as exc:  # noqa: BLE001 - connection refused, timeout: one error type
            raise EmbeddingServiceError(f"embedding service {self.url}: {exc!r}") from exc
        if resp.status_code != 200:
            raise EmbeddingServiceError(
                f"embedding service {self.url} answered {resp.status_code}: {resp.text[:200]}")
        try:
            vecs = np.asarray(resp.json(), dtype=np.float32)
        except ValueError as exc:
            raise EmbeddingServiceError(f"embedding service {self.url}: not JSON vectors") from exc
        if vecs.shape != (len(texts), DIM):
            raise EmbeddingServiceError(f"embedding service {self.url} answered shape "
                                        f"{vecs.shape} for {len(texts)} texts (want ({len(texts)}, {DIM}))")
        norms = np.linalg.norm(vecs, axis=1, keepdims=True)
        return vecs / np.clip(norms, 1e-12, None)

    def close(self) -> None:
        self.client.close()
