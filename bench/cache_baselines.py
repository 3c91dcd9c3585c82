"""GPTCache's own pipeline for bench/cache.py, fed the same MiniLM vectors as Sluice.

GPTCache (``pip install --no-deps --target /tmp/gptcache_pkg gptcache cachetools``; the
folder is ``GPTCACHE_PATH``) runs as documented: ``Cache.init`` with ``get_prompt``, an
embedding function (ours: a lookup of the precomputed all-MiniLM-L6-v2 vectors, so every
method sees identical embeddings), a data manager (SQLite scalar store + a flat L2 vector
store with the semantics of its faiss ``IndexFlatL2`` store: faiss is not installed here, and
GPTCache would try to pip-install it), a similarity evaluation and ``put``/``get``.

Evaluations: ``SearchDistanceEvaluation`` (its default) scores 4 - squared L2 distance, a
monotone transform of cosine: on one stored entry it is plain cosine under another name,
and the table says so. ``KReciprocalEvaluation`` also asks whether the query is among the
candidate's own nearest neighbours, which depends on what else is cached; it only means
something in the shared-cache table.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np


def load_gptcache() -> bool:
    path = os.environ.get("GPTCACHE_PATH", "/tmp/gptcache_pkg")
    if path not in sys.path:
        sys.path.insert(0, path)
    try:
        import gptcache  # noqa: F401
        from gptcache.adapter.api import get, put  # noqa: F401
    except ImportError:
        return False
    return True


def _flat_l2_store(dim: int, top_k: int):
    from gptcache.manager.vector_data.base import VectorBase

    class FlatL2Store(VectorBase):
        """Exact squared-L2 search, returning ``[(distance, id)]`` like GPTCache's faiss store."""

        def __init__(self) -> None:
            self.top_k = top_k
            self.ids: list[int] = []
            self.vecs = np.zeros((0, dim), dtype=np.float32)

        def mul_add(self, datas):
            self.vecs = np.vstack([self.vecs, *[np.asarray(d.data, dtype=np.float32).reshape(1, -1)
                                                for d in datas]])
            self.ids += [int(d.id) for d in datas]

        def search(self, data, top_k: int = -1):
            if not self.ids:
                return None
            k = self.top_k if top_k == -1 else top_k
            dist = ((self.vecs - np.asarray(data, dtype=np.float32).reshape(1, -1)) ** 2).sum(axis=1)
            order = np.argsort(dist, kind="stable")[:k]
            return [(float(dist[i]), self.ids[i]) for i in order]

        def rebuild(self, ids=None) -> bool:
            return True

        def delete(self, ids) -> bool:
            keep = [i for i, x in enumerate(self.ids) if x not in set(ids)]
            self.vecs, self.ids = self.vecs[keep], [self.ids[i] for i in keep]
            return True

        def get_embeddings(self, data_id):
            return self.vecs[self.ids.index(int(data_id))] if int(data_id) in self.ids else None

    return FlatL2Store()


def _new_cache(vectors: dict[str, np.ndarray], evaluation: str, threshold: float, folder: Path):
    from gptcache import Cache, Config
    from gptcache.manager import CacheBase, get_data_manager
    from gptcache.processor.pre import get_prompt
    from gptcache.similarity_evaluation import KReciprocalEvaluation, SearchDistanceEvaluation

    store = _flat_l2_store(len(next(iter(vectors.values()))), top_k=1)  # GPTCache's default top_k
    folder.mkdir(parents=True, exist_ok=True)
    dm = get_data_manager(CacheBase("sqlite", sql_url=f"sqlite:///{folder}/gptcache.db"), store,
                          max_size=10**6)
    ev = (SearchDistanceEvaluation() if evaluation == "distance"
          else KReciprocalEvaluation(vectordb=store, top_k=3))
    cache = Cache()
    cache.init(pre_embedding_func=get_prompt,
               embedding_func=lambda text, **_: vectors[text],
               data_manager=dm, similarity_evaluation=ev,
               config=Config(similarity_threshold=threshold))
    return cache


def gptcache_answers(pairs: list[dict], vectors: dict[str, np.ndarray], evaluation: str,
                     threshold: float, shared: bool,
                     answer_of: Callable[[str], str]) -> list[str | None]:
    """What GPTCache serves for each ``b``: with ``shared`` every ``a`` sits in one cache (as
    in production); otherwise each pair gets a cache holding only its ``a`` (the drill)."""
    from gptcache.adapter.api import get, put
    out: list[str | None] = []
    with tempfile.TemporaryDirectory(prefix="gptcache-bench-") as tmp:
        if shared:
            cache = _new_cache(vectors, evaluation, threshold, Path(tmp) / "shared")
            for p in pairs:
                put(p["a"], answer_of(p["a"]), cache_obj=cache)
            return [get(p["b"], cache_obj=cache) for p in pairs]
        for i, p in enumerate(pairs):
            cache = _new_cache(vectors, evaluation, threshold, Path(tmp) / str(i))
            put(p["a"], answer_of(p["a"]), cache_obj=cache)
            out.append(get(p["b"], cache_obj=cache))
            cache.data_manager.close()
    return out
