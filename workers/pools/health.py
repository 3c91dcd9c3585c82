"""An engine's ``/health`` and ``/metrics`` over HTTP (vLLM and the reference engine
answer the same way: 200 when serving, 503 when the engine died)."""
from __future__ import annotations

import time
from typing import Callable

import httpx


def check(url: str, timeout_s: float = 2.0) -> tuple[bool, str]:
    """(healthy, detail)."""
    try:
        resp = httpx.get(f"{url.rstrip('/')}/health", timeout=timeout_s)
    except httpx.HTTPError as exc:
        return False, f"unreachable: {type(exc).__name__}"
    if resp.status_code == 200:
        return True, "ok"
    return False, f"/health {resp.status_code}: {resp.text[:200]}"


def is_broken(detail: str) -> bool:
    """A 503 that is not "still loading": the engine died (vLLM does not answer before it
    is up; the reference engine answers 503 "loading" while it loads)."""
    return detail.startswith("/health 503") and not detail.endswith("loading")


def wait_healthy(url: str, timeout_s: float, *, alive: Callable[[], bool] = lambda: True,
                 interval_s: float = 0.5) -> tuple[bool, str]:
    """Poll until healthy, the process dies, or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    detail = "not checked"
    while time.monotonic() < deadline:
        ok, detail = check(url)
        if ok:
            return True, detail
        if not alive():
            return False, f"process exited ({detail})"
        if is_broken(detail):
            return False, detail
        time.sleep(interval_s)
    return False, f"not healthy after {timeout_s:.0f}s ({detail})"


def fetch_metrics(url: str, timeout_s: float = 3.0) -> str:
    resp = httpx.get(f"{url.rstrip('/')}/metrics", timeout=timeout_s)
    resp.raise_for_status()
    return resp.text
