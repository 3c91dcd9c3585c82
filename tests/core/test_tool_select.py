"""Tool-definition retrieval's choice of tools (plain data)."""
from __future__ import annotations

import numpy as np

from app.core.tool_select import learned_tools, select_tools


def _tools(*names):
    return [{"type": "function", "function": {"name": n, "parameters": {}}} for n in names]


TOOLS = _tools("zeta", "alpha", "mid", "beta", "gamma")
CALLED = [{"role": "user", "content": "x"},
          {"role": "assistant", "content": None, "tool_calls": [
              {"id": "1", "type": "function", "function": {"name": "gamma", "arguments": "{}"}}]},
          {"role": "tool", "tool_call_id": "1", "content": "ok"}]


def test_choice_called_and_pinned_are_kept_past_k_then_the_most_similar_by_name():
    sel = select_tools(TOOLS, CALLED, {"type": "function", "function": {"name": "zeta"}},
                       k=2, pinned=["beta"], similarity=[0, 0.1, 0.9, 0, 0])
    assert [t["function"]["name"] for t in sel.sent] == ["beta", "gamma", "zeta"]
    assert sel.reasons == {"zeta": "choice", "gamma": "called", "beta": "pinned"}
    sel = select_tools(TOOLS, [], "auto", k=3, pinned=[], similarity=[0, 0.1, 0.9, 0.5, 0])
    assert [t["function"]["name"] for t in sel.sent] == ["alpha", "beta", "mid"]
    assert sel.dropped == ["zeta", "gamma"]


def test_learned_tools_come_from_alike_past_conversations_and_add_to_the_score():
    q = np.array([1.0, 0.0])
    memory = [(np.array([0.0, 1.0]), ("zeta",)), (np.array([0.8, 0.6]), ("beta", "alpha"))]
    assert learned_tools(q, memory, min_similarity=0.5) == {"beta": 0.8, "alpha": 0.8}
    assert learned_tools(q, memory, min_similarity=0.9) == {}
    sel = select_tools(TOOLS, [], "auto", k=2, pinned=[], similarity=[0, 0, 0.9, 0.1, 0],
                       learned={"beta": 0.5, "alpha": 0.3})
    assert sel.reasons == {"mid": "similar", "beta": "learned"}   # 0.9 vs 0.6 vs 0.3


def test_lexical_scores_count_the_tools_name_words_the_request_uses():
    from app.core.tool_select import lexical_scores
    tools = _tools("create_github_issue", "send_email", "play_music")
    assert lexical_scores("Open an issue about the crash", tools) == [1 / 3, 0.0, 0.0]
    assert lexical_scores("email the report", tools) == [0.0, 0.5, 0.0]


def test_companions_of_the_best_scored_tools_get_a_bonus():
    co = {"mid": {"zeta": 3}, "beta": {"gamma": 1}}
    sel = select_tools(TOOLS, [], "auto", k=2, pinned=[], similarity=[0.1, 0.15, 0.9, 0.1, 0.2],
                       co_called=co, companion_weight=0.2, companion_of=1)
    assert sel.reasons == {"mid": "similar", "zeta": "companion"}   # 0.1 + 0.2 > 0.2
