"""Chaos drill CD-28C: lose replicas mid-load behind the gateway.

Multi-turn sessions (``X-Sluice-Session``) run through the gateway; after a few turns
``stop`` takes ``stop_count`` replicas away and the sessions go on. Requests are sent one
at a time, so the replica that served each one is the one whose
``vllm:prefix_cache_queries`` counter moved: that is how the drill sees, from the replicas
themselves, which keys moved. It reports failed client requests (the gateway must retry
on a live replica before the first byte), sessions that moved although their replica
survived (rendezvous hashing promises none), and the prefix hit rate per turn after the
loss (recovery: the moved sessions rebuild their history on the new replica).
"""
from __future__ import annotations

import random
from typing import Any, Callable

import httpx

from app.replica_routing.live import make_sessions, reply_text, scrape


def _owner(before: dict, after: dict) -> tuple[Any, float, float]:
    """(replica id that served, queried tokens, hit tokens) from two scrapes of all."""
    best, q_best, h_best = None, 0.0, 0.0
    for rid, a in after.items():
        b = before.get(rid)
        if a is None or b is None:
            continue
        q = a["vllm:prefix_cache_queries"] - b["vllm:prefix_cache_queries"]
        if q > q_best:
            best, q_best = rid, q
            h_best = a["vllm:prefix_cache_hits"] - b["vllm:prefix_cache_hits"]
    return best, q_best, h_best


def run_replica_loss(gateway_url: str, key: str, replicas: list[dict],
                     stop: Callable[[list[dict]], None], *, stop_count: int = 2,
                     sessions: int = 8, teams: int = 2, turns_before: int = 3,
                     turns_after: int = 4, model: str = "auto", max_tokens: int = 8,
                     prompt_words: int = 300, timeout_s: float = 120.0,
                     seed: int = 0, victims: list | None = None,
                     progress: Callable[[dict], None] | None = None) -> dict:
    """``replicas``: ``[{"id", "url"}]`` of the pool behind the gateway's tier;
    ``victims``: ids to stop (default: chosen from who owns which sessions);
    ``progress`` gets each turn's record as the turn ends."""
    rng = random.Random(seed)
    chats = make_sessions(sessions, teams, prompt_words, prefix=f"drill{seed}-")
    urls = {r["id"]: r["url"] for r in replicas}
    owners: dict[str, list] = {c.session_id: [] for c in chats}
    turns: list[dict] = []
    failures: list[dict] = []
    stopped: list[dict] = []
    with httpx.Client(timeout=httpx.Timeout(timeout_s, connect=5.0)) as client:
        def scrape_all() -> dict:
            return {rid: scrape(client, u) for rid, u in urls.items()
                    if rid not in {s["id"] for s in stopped}}

        for turn in range(turns_before + turns_after):
            if turn == turns_before:
                home = {c.session_id: owners[c.session_id][-1] for c in chats
                        if owners[c.session_id]}
                # every other replica by sessions owned: dead ones own sessions (keys
                # must move) and live ones keep some (those keys must not)
                counts = {rid: list(home.values()).count(rid) for rid in urls}
                ranked = sorted(urls, key=lambda rid: (-counts[rid], str(rid)))
                chosen = list(victims) if victims else (ranked[0::2] + ranked[1::2])[:stop_count]
                stopped = [{"id": rid, "url": urls[rid]} for rid in chosen]
                stop(stopped)
            q_sum = h_sum = 0.0
            for chat in chats:
                body = chat.next_body(rng, model, max_tokens)
                before = scrape_all()
                try:
                    resp = client.post(gateway_url.rstrip("/") + "/v1/chat/completions",
                                       json=body, headers={"Authorization": f"Bearer {key}",
                                                           "X-Sluice-Session": chat.session_id})
                    status = resp.status_code
                    chat.add_reply(reply_text(resp) if status == 200 else "")
                except httpx.HTTPError as exc:
                    status, resp = 0, None
                    failures.append({"turn": turn, "session": chat.session_id,
                                     "error": str(exc)[:200]})
                    chat.add_reply("")
                if status != 200 and resp is not None:
                    failures.append({"turn": turn, "session": chat.session_id, "status": status,
                                     "body": resp.text[:200]})
                owner, q, h = _owner(before, scrape_all())
                owners[chat.session_id].append(owner)
                q_sum, h_sum = q_sum + q, h_sum + h
            turns.append({"turn": turn, "after_loss": turn >= turns_before,
                          "hit_rate": round(h_sum / q_sum, 4) if q_sum else None})
            if progress is not None:
                progress(turns[-1])
    dead = {s["id"] for s in stopped}
    before_home = {sid: o[turns_before - 1] for sid, o in owners.items() if len(o) >= turns_before}
    after_home = {sid: o[turns_before] for sid, o in owners.items() if len(o) > turns_before}
    moved = [sid for sid in after_home if after_home[sid] != before_home.get(sid)]
    wrongly = [sid for sid in moved if before_home.get(sid) not in dead]
    requests = sessions * (turns_before + turns_after)
    return {"requests": requests, "failed_requests": len(failures), "failures": failures[:20],
            "stopped": [s["id"] for s in stopped],
            "sessions_on_dead_replicas": sum(1 for o in before_home.values() if o in dead),
            "sessions_moved": len(moved), "sessions_moved_from_live_replicas": len(wrongly),
            "served_by_dead_after_loss": sum(1 for sid, o in owners.items()
                                             for x in o[turns_before:] if x in dead),
            "unattributed": sum(1 for o in owners.values() for x in o if x is None),
            # where the sessions lived before the loss (replica id -> sessions)
            "sessions_per_replica": {str(rid): sum(1 for o in before_home.values() if o == rid)
                                     for rid in urls},
            "turns": turns}


def live_moves_allowed(result: dict, replica_choice: str | None) -> int:
    """Sessions the policy may move off replicas that survived: none under rendezvous
    (its promise); under ``kv_events`` up to a third of the live replicas' sessions, as
    its bound on requests sent can push one off a survivor that the moved sessions filled
    past ceil(1.25 x mean) (tests/replica_routing/test_replica_loss_kv_live.py)."""
    if replica_choice != "kv_events":
        return 0
    live = sum(result.get("sessions_per_replica", {}).values()) - \
        result["sessions_on_dead_replicas"]
    return max(0, live) // 3


def drill_passed(result: dict, replica_choice: str | None = None) -> bool:
    return (result["failed_requests"] == 0
            and result["sessions_moved_from_live_replicas"]
            <= live_moves_allowed(result, replica_choice)
            and result["served_by_dead_after_loss"] == 0
            and result["sessions_moved"] >= result["sessions_on_dead_replicas"] > 0)
