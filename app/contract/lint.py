"""Template lint from live traffic: the gateway feeds system-prompt samples per workflow,
the console reads back where each workflow's prompt first turns dynamic and what that
costs in prefix tokens per day.

Redis layout (``<ns>`` is the namespace, ``<wf>`` is ``<tenant_id>:<workflow>``):

- ``<ns>:lint:workflows``            set of ``<wf>``
- ``<ns>:lint:<wf>:n:<yyyymmdd>``    requests counted that UTC day (kept 3 days)
- ``<ns>:lint:<wf>:samples``         list, newest first, of at most ``KEEP`` prompts.

Writers: the gateway's ``LintSampler`` counts requests in memory and, after the answer,
writes a workflow's count and one sample of its system prompt on its first request and
then at most once per ``SAMPLE_INTERVAL_S`` (counts of quiet workflows are flushed on the
same interval): one pipeline per workflow per minute, whatever the traffic. The sync
``record_prompt_sample`` (scripts, tests) counts every call and keeps the first ``KEEP``
prompts, then every ``SAMPLE_EVERY``-th.
"""
from __future__ import annotations

import datetime as dt
import time
from typing import Callable

from app.core.template_lint import LintResult, approx_tokens, lint_samples, tokens_lost_per_day
from app.contract.keys import Keys

KEEP = 12
SAMPLE_EVERY = 50
MAX_CHARS = 64_000
DAY_TTL_S = 3 * 86400


def _k(ns: Keys | str) -> Keys:
    return ns if isinstance(ns, Keys) else Keys(ns)


def _day(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y%m%d")


def _count_cmds(k: Keys, wf: str, n: int, ts: float) -> list[tuple[str, tuple]]:
    day_key = k.lint_requests(wf, _day(ts))
    return [("incrby", (day_key, n)), ("expire", (day_key, DAY_TTL_S)),
            ("sadd", (k.lint_workflows(), wf))]


def _sample_cmds(k: Keys, wf: str, system_prompt: str) -> list[tuple[str, tuple]]:
    samples = k.lint_samples(wf)
    return [("lpush", (samples, system_prompt[:MAX_CHARS])), ("ltrim", (samples, 0, KEEP - 1)),
            ("expire", (samples, 7 * 86400))]


def _queue(pipe, cmds: list[tuple[str, tuple]]) -> None:
    for name, args in cmds:
        getattr(pipe, name)(*args)


def system_prompt_of(body: dict) -> str:
    """The leading system/developer messages of a chat request, as the engine sees them."""
    parts = []
    for m in body.get("messages") or []:
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer"):
            break
        content = m.get("content")
        if isinstance(content, list):
            content = "\n".join(p.get("text", "") for p in content
                                if isinstance(p, dict) and p.get("type") == "text")
        parts.append(content if isinstance(content, str) else "")
    return "\n".join(parts)


def record_prompt_sample(redis, ns: Keys | str, tenant_id: int | str, workflow: str,
                         system_prompt: str, *, now: float | None = None) -> bool:
    """Count one request of the workflow and keep its system prompt when sampled.
    Returns whether the prompt was stored. Costs one round trip, two when sampling."""
    k = _k(ns)
    wf = f"{tenant_id}:{workflow}"
    ts = time.time() if now is None else now
    pipe = redis.pipeline(transaction=False)
    _queue(pipe, _count_cmds(k, wf, 1, ts))
    pipe.llen(k.lint_samples(wf))
    n, _, _, have = pipe.execute()
    if have >= KEEP and n % SAMPLE_EVERY != 1:
        return False
    pipe = redis.pipeline(transaction=False)
    _queue(pipe, _sample_cmds(k, wf, system_prompt))
    pipe.execute()
    return True


class LintSampler:
    """The gateway's side (redis.asyncio): ``note`` is called once per request that went
    to a model and costs a dict update; at most once per ``interval_s`` per workflow it
    returns a coroutine (run it after the answer) that writes the requests counted since
    and this request's system prompt. ``flush`` writes the counts still held (run it on
    the same interval and at shutdown)."""

    MAX_TRACKED = 10_000

    def __init__(self, redis, ns: Keys | str, interval_s: float = 60.0) -> None:
        self.redis, self.keys, self.interval_s = redis, _k(ns), interval_s
        self.pending: dict[str, int] = {}
        self._last: dict[str, float] = {}

    def note(self, tenant_id: int | str, workflow: str, body: dict, *,
             clock: Callable[[], float] = time.monotonic):
        if not workflow:
            return None
        wf = f"{tenant_id}:{workflow}"
        self.pending[wf] = self.pending.get(wf, 0) + 1
        now = clock()
        if now - self._last.get(wf, float("-inf")) < self.interval_s:
            return None
        if len(self._last) >= self.MAX_TRACKED:     # many one-off workflows: start over
            self._last.clear()
        self._last[wf] = now
        prompt = system_prompt_of(body)
        return self._write(wf, self.pending.pop(wf), prompt)

    async def _write(self, wf: str, n: int, prompt: str) -> None:
        pipe = self.redis.pipeline(transaction=False)
        _queue(pipe, _count_cmds(self.keys, wf, n, time.time()))
        if prompt:
            _queue(pipe, _sample_cmds(self.keys, wf, prompt))
        await pipe.execute()

    async def flush(self) -> None:
        held, self.pending = self.pending, {}
        if not held:
            return
        pipe = self.redis.pipeline(transaction=False)
        ts = time.time()
        for wf, n in held.items():
            _queue(pipe, _count_cmds(self.keys, wf, n, ts))
        await pipe.execute()


def requests_per_day(redis, ns: Keys | str, wf: str, *, now: float | None = None) -> float:
    """Yesterday's count when there is one, else today's so far scaled to a full day."""
    k = _k(ns)
    ts = time.time() if now is None else now
    today, yesterday = redis.mget(k.lint_requests(wf, _day(ts)),
                                  k.lint_requests(wf, _day(ts - 86400)))
    if yesterday:
        return float(yesterday)
    midnight = dt.datetime.fromtimestamp(ts, dt.timezone.utc).replace(
        hour=0, minute=0, second=0, microsecond=0).timestamp()
    elapsed = max(3600.0, ts - midnight)          # at least an hour, to damp early spikes
    return float(today or 0) * 86400.0 / elapsed


def analyze_workflow(redis, ns: Keys | str, wf: str, *,
                     count_tokens: Callable[[str], int] = approx_tokens,
                     now: float | None = None) -> dict:
    k = _k(ns)
    raw = redis.lrange(k.lint_samples(wf), 0, KEEP - 1)
    samples = [s.decode("utf-8", "replace") if isinstance(s, bytes) else s for s in raw]
    result: LintResult = lint_samples(samples, count_tokens)
    per_day = requests_per_day(redis, ns, wf, now=now)
    tenant_id, _, workflow = wf.partition(":")
    return {"tenant_id": int(tenant_id) if tenant_id.isdigit() else tenant_id,
            "workflow": workflow, "samples": len(samples),
            "prompt_tokens": result.prompt_tokens,
            "first_dynamic_token": result.first_dynamic_token,
            "kind": result.kind, "snippet": result.snippet, "confirmed": result.confirmed,
            "requests_per_day": round(per_day, 1),
            "tokens_lost_per_request": result.cacheable_tokens_lost,
            "tokens_lost_per_day": tokens_lost_per_day(result, per_day),
            "findings": [{"kind": f.kind, "text": f.text[:60]} for f in result.findings[:8]]}


def lint_report(redis, ns: Keys | str, *, tenant_id: int | None = None,
                count_tokens: Callable[[str], int] = approx_tokens,
                now: float | None = None) -> list[dict]:
    """Every recorded workflow (one tenant's when given), costliest first."""
    k = _k(ns)
    wfs = sorted(w.decode() if isinstance(w, bytes) else w
                 for w in redis.smembers(k.lint_workflows()))
    if tenant_id is not None:
        wfs = [w for w in wfs if w.split(":", 1)[0] == str(tenant_id)]
    rows = [analyze_workflow(redis, k, w, count_tokens=count_tokens, now=now) for w in wfs]
    return sorted(rows, key=lambda r: (-r["tokens_lost_per_day"], r["workflow"]))
