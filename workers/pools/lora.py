"""LoRA hot-load/unload on every replica of a pool through vLLM's runtime endpoints."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Iterable

import httpx


def _call(url: str, path: str, body: dict, timeout_s: float, api_key: str | None = None
          ) -> dict:
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        resp = httpx.post(f"{url.rstrip('/')}{path}", json=body, timeout=timeout_s,
                          headers=headers)
    except httpx.HTTPError as exc:
        return {"ok": False, "status": None, "detail": f"unreachable: {type(exc).__name__}"}
    ok = resp.status_code == 200
    # vLLM answers 200 with a text line, or an error object; re-loading a loaded
    # adapter is a 400 "already been loaded", which leaves the replica as wanted.
    if not ok and resp.status_code == 400 and "already been loaded" in resp.text:
        ok = True
    return {"ok": ok, "status": resp.status_code, "detail": resp.text[:300]}


def _fan_out(replicas: Iterable[tuple[int, str]], path: str, body: dict,
             timeout_s: float, api_key: str | None = None) -> dict[int, dict]:
    replicas = list(replicas)
    if not replicas:
        return {}
    with ThreadPoolExecutor(max_workers=min(8, len(replicas))) as ex:
        futures = {rid: ex.submit(_call, url, path, body, timeout_s, api_key)
                   for rid, url in replicas}
        return {rid: f.result() for rid, f in futures.items()}


def load_everywhere(replicas: Iterable[tuple[int, str]], lora_name: str, lora_path: str,
                    *, timeout_s: float = 120.0, api_key: str | None = None
                    ) -> dict[int, dict]:
    """``{replica_id: {"ok", "status", "detail"}}`` for each (replica_id, url)."""
    return _fan_out(replicas, "/v1/load_lora_adapter",
                    {"lora_name": lora_name, "lora_path": lora_path}, timeout_s, api_key)


def unload_everywhere(replicas: Iterable[tuple[int, str]], lora_name: str, *,
                      timeout_s: float = 60.0, api_key: str | None = None) -> dict[int, dict]:
    results = _fan_out(replicas, "/v1/unload_lora_adapter", {"lora_name": lora_name},
                       timeout_s, api_key)
    for r in results.values():  # already gone is what unloading wants
        if r["status"] == 404 and "cannot be found" in r["detail"]:
            r["ok"] = True
    return results
