"""Helpers shared by the replica-loss drill and ``bench/prefix_routing.py``: reading a
replica's prefix-cache counters from its own ``/metrics``, and a small multi-session chat
workload whose prompts share static prefixes the way the seed's do."""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import httpx

COUNTERS = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits")


def parse_counters(text: str, names: tuple[str, ...] = COUNTERS) -> dict[str, float]:
    """Sum of each counter over its label sets (``_total`` suffix or not)."""
    out = {n: 0.0 for n in names}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        metric, _, rest = line.partition("{") if "{" in line else line.partition(" ")
        base = metric.strip().removesuffix("_total")
        if base in out:
            try:
                out[base] += float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                pass
    return out


def scrape(client: httpx.Client, url: str, names: tuple[str, ...] = COUNTERS
           ) -> dict[str, float] | None:
    """The replica's counters (``names``, summed over label sets), or None when it does
    not answer."""
    try:
        resp = client.get(url.rstrip("/") + "/metrics", timeout=5.0)
        resp.raise_for_status()
    except httpx.HTTPError:
        return None
    return parse_counters(resp.text, names)


def hit_rate(before: dict[str, float], after: dict[str, float]) -> float | None:
    q = after["vllm:prefix_cache_queries"] - before["vllm:prefix_cache_queries"]
    h = after["vllm:prefix_cache_hits"] - before["vllm:prefix_cache_hits"]
    return h / q if q > 0 else None


_DOC_WORDS = ["order", "item", "ship", "refund", "sku", "note", "case", "line", "batch", "lot"]
_TOPICS = ["invoices", "refunds", "shipping delays", "password resets", "contract renewals",
           "warranty claims", "data exports", "API quotas"]


def system_prompt(team: int, words: int) -> str:
    rng = random.Random(1000 + team)
    vocab = ["policy", "customer", "always", "never", "escalate", "tone", "concise", "JSON",
             "verify", "account", "region", "tool", "schema", "field", "answer", "cite"]
    rules = " ".join(rng.choice(vocab) for _ in range(words))
    return (f"You are the assistant of team {team}. Answer about {_TOPICS[team % len(_TOPICS)]}."
            f" Rules: {rules}.")


@dataclass
class ChatSession:
    """One conversation: a team's static system prompt plus its own growing history."""

    session_id: str
    team: int
    system: str
    messages: list[dict] = field(default_factory=list)

    def next_body(self, rng: random.Random, model: str, max_tokens: int,
                  context_words: int = 0) -> dict:
        """The next turn; ``context_words`` of retrieved text ride along in the user turn
        (RAG chunks, tool output), so the history grows the way the seed's does."""
        q = f"Question {len(self.messages) // 2 + 1}: about order {rng.randint(1000, 99999)}?"
        if context_words:
            doc = " ".join(f"{rng.choice(_DOC_WORDS)}{rng.randint(0, 99)}"
                           for _ in range(context_words))
            q = f"Context: {doc}\n{q}"
        self.messages.append({"role": "user", "content": q})
        return {"model": model, "max_tokens": max_tokens, "temperature": 0,
                "messages": [{"role": "system", "content": self.system}, *self.messages]}

    def add_reply(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text or "ok"})


def make_sessions(n: int, teams: int, prompt_words: int, prefix: str = "s") -> list[ChatSession]:
    return [ChatSession(f"{prefix}{i}", i % teams, system_prompt(i % teams, prompt_words))
            for i in range(n)]


def reply_text(resp: httpx.Response) -> str:
    try:
        return resp.json()["choices"][0]["message"]["content"] or ""
    except (ValueError, KeyError, IndexError, TypeError):
        return ""
