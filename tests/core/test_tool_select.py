"""Tool-definition retrieval's choice of tools (plain data)."""
from __future__ import annotations

import numpy as np

from app.core.tool_select import centroid_scores, learned_tools, select_tools


def _tools(*names):
    return [{"type": "function", "function": {"name": n, "parameters": {}}} for n in names]


TOOLS = _tools("zeta", "alpha", "mid", "beta", "gamma")
CALLED = [{"role": "user", "content": "x"},
          {"role": "assistant", "content": None, "tool_calls": [
              {"id": "1", "type": "function", "function": {"name": "gamma", "arguments": "{}"}}]},
          {"role": "tool", "tool_call_id": "1", "content": "ok"}]


def test_choice_called_and_pinned_are_kept_then_the_k_most_similar_by_name():
    sel = select_tools(TOOLS, CALLED, {"type": "function", "function": {"name": "zeta"}},
                       k=1, pinned=["beta"], similarity=[0, 0.1, 0.9, 0, 0])
    assert [t["function"]["name"] for t in sel.sent] == ["beta", "gamma", "mid", "zeta"]
    assert sel.reasons == {"zeta": "choice", "gamma": "called", "beta": "pinned",
                           "mid": "similar"}
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


def test_centroid_scores_gather_the_wordings_of_one_need():
    """Three past wordings that called search_emails, each far from the new request, point
    their mean at it; a tool called for unrelated requests gets nothing."""
    def unit(*xs):
        v = np.array(xs, dtype=np.float32)
        return v / np.linalg.norm(v)
    other = np.array([0, 0, 0, 0, 1.0], np.float32)
    past = [(unit(1, 1, 0, 0, 0), ["search_emails"]), (unit(1, -1, 0, 0, 0), ["search_emails"]),
            (unit(1, 0, 1.2, 0, 0), ["search_emails", "read_email"]), (other, ["play_music"])]
    query = unit(1, 0, -1, 1, 0)
    assert learned_tools(query, past, min_similarity=0.6) == {}     # no one wording is near
    got = centroid_scores(query, past, threshold=0.2, weight=0.3)
    mean = sum(v for v, names in past if "search_emails" in names)
    cos = float(mean @ query) / float(np.linalg.norm(mean))         # to the mean of the three
    assert cos > 0.2 and all(float(v @ query) < 0.6 for v, _ in past)
    assert abs(got["search_emails"] - 0.3 * (cos - 0.2) / 0.8) < 1e-6
    assert "play_music" not in got and "read_email" not in got     # one far wording: below
    assert centroid_scores(query, [], threshold=0.2, weight=0.3) == {}


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


def test_past_k_up_to_k_max_the_tools_within_the_margin_of_the_best():
    sims = [0.1, 0.55, 0.6, 0.52, 0.3]   # zeta alpha mid beta gamma
    sel = select_tools(TOOLS, [], "auto", k=1, pinned=[], similarity=sims, k_max=3,
                       margin=0.1)
    assert sel.names == {"mid", "alpha", "beta"}
    sel = select_tools(TOOLS, [], "auto", k=1, pinned=[], similarity=sims, k_max=2,
                       margin=0.1)
    assert sel.names == {"mid", "alpha"}
    sel = select_tools(TOOLS, [], "auto", k=1, pinned=[], similarity=sims, k_max=3,
                       margin=0.04)
    assert sel.names == {"mid"}


CATALOGUE = [{"type": "function", "function": {
    "name": name, "description": desc + " Use only when the user asks for it.",
    "parameters": {"type": "object", "properties": {
        p: {"type": "string", "description": d} for p, d in params.items()}}}}
    for name, desc, params in [
        ("search_customers", "Find CRM customers by name.", {"query": "Name words"}),
        ("create_invoice", "Bill a customer.", {"customer_id": "CRM customer id"}),
        ("search_emails", "Search the mailbox.", {"query": "Words"}),
        ("read_email", "One message.", {"message_id": "Id returned by search_emails"}),
        ("send_email", "Send mail.", {"attachments": "Drive file ids to attach"}),
        ("search_drive", "Find files in the drive.", {"query": "Words"}),
        ("get_weather", "Weather in a city.", {"city": "City name"})]]


def test_prerequisites_are_the_lookups_whose_ids_a_tool_takes():
    from app.core.tool_select import prerequisites, tool_fields
    assert prerequisites(CATALOGUE) == {"create_invoice": ["search_customers"],
                                        "read_email": ["search_emails"],
                                        "send_email": ["search_drive"]}
    # the sentence every tool repeats is not a field; name, own sentences, parameters are
    assert tool_fields(CATALOGUE)[1] == ["create invoice", "Bill a customer.",
                                         "customer id: CRM customer id"]


def test_a_sent_tool_brings_its_lookup_and_a_called_lookup_lifts_its_consumers():
    from app.core.tool_select import prerequisites
    pre = prerequisites(CATALOGUE)
    sims = [0.1, 0.6, 0.1, 0.1, 0.1, 0.1, 0.3]
    sel = select_tools(CATALOGUE, [], "auto", k=1, pinned=[], similarity=sims,
                       prerequisite=pre)
    assert sel.reasons == {"create_invoice": "similar", "search_customers": "prerequisite"}
    looked = [{"role": "user", "content": "x"},
              {"role": "assistant", "content": None, "tool_calls": [{"id": "1",
               "type": "function", "function": {"name": "search_emails", "arguments": "{}"}}]}]
    sims = [0.1, 0.1, 0.1, 0.2, 0.1, 0.1, 0.3]   # read_email 0.2 + 0.2 passes get_weather
    sel = select_tools(CATALOGUE, looked, "auto", k=1, pinned=[], similarity=sims,
                       prerequisite=pre, consumer_weight=0.2)
    assert sel.reasons == {"search_emails": "called", "read_email": "similar"}


def test_a_multi_step_request_is_split_into_its_clauses():
    from app.core.tool_select import query_clauses
    assert query_clauses("When does registration close? Check online and remind me the "
                         "day before.") == ["When does registration close?", "Check online",
                                            "remind me the day before."]
    assert query_clauses("Do it; then go") == []                 # parts under 9 chars
    assert query_clauses("What time is it in Singapore?") == []


def test_a_low_best_score_on_a_first_turn_sends_more_within_the_wider_margin():
    sims = [0.40, 0.38, 0.30, 0.20, 0.10]
    kw = dict(k=1, pinned=[], similarity=sims, low=0.45, k_low=4, margin_low=0.15)
    sel = select_tools(TOOLS, [], "auto", **kw)
    assert sel.names == {"zeta", "alpha", "mid"}                # 0.20 is past the margin
    sel = select_tools(TOOLS, [], "auto", **{**kw, "similarity": [0.9, 0.85, 0.8, 0, 0]})
    assert sel.names == {"zeta"}                                 # confident: k only
    sel = select_tools(TOOLS, CALLED, "auto", **kw)
    assert sel.names == {"zeta", "gamma"}                        # a tool was called: k only


def test_stubs_are_the_next_best_scored_in_canonical_order_with_names_and_types_only():
    from app.core.tool_select import stub_definition
    tool = {"type": "function", "function": {
        "name": "get_weather", "description": "Return the weather for a city over the next "
        "ten days with rain and wind. Use only when asked.",
        "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                       "properties": {
                           "city": {"type": "string", "description": "City name"},
                           "units": {"type": "string", "enum": ["metric", "imperial"],
                                     "description": "Units"},
                           "days": {"type": "array", "items": {"type": "integer",
                                                               "description": "d"}}}}}}
    assert stub_definition(tool) == {"type": "function", "function": {
        "name": "get_weather", "description": "Return the weather for a city over the ...",
        "parameters": {"type": "object", "required": ["city"], "properties": {
            "city": {"type": "string"}, "units": {"type": "string",
                                                  "enum": ["metric", "imperial"]},
            "days": {"type": "array", "items": {"type": "integer"}}}}}}
    sel = select_tools(TOOLS, CALLED, "auto", k=1, pinned=[], stubs=2,
                       similarity=[0.5, 0.1, 0.9, 0.3, 0])
    assert sel.reasons == {"gamma": "called", "mid": "similar", "zeta": "stub",
                           "beta": "stub"}
    assert sel.stubbed == ["zeta", "beta"] and sel.dropped == ["alpha"]
    assert [t["function"]["name"] for t in sel.sent] == ["beta", "gamma", "mid", "zeta"]
    assert sel.sent[0] == stub_definition(TOOLS[3]) and sel.sent[2] == TOOLS[2]


def test_with_full_only_the_best_scored_picks_go_in_full_and_the_rest_as_stubs():
    from app.core.tool_select import stub_definition
    sel = select_tools(TOOLS, [], "auto", k=3, pinned=["alpha"], full=1, stubs=1,
                       similarity=[0.5, 0.1, 0.9, 0.3, 0.8])
    # the three best scored are mid, gamma, zeta: mid in full, gamma and zeta as stubs,
    # then one stub more, beta; alpha (pinned) in full whatever its score
    assert sel.reasons == {"alpha": "pinned", "mid": "similar", "gamma": "stub",
                           "zeta": "stub", "beta": "stub"}
    assert sel.stubbed == ["gamma", "zeta", "beta"]
    by_name = {t["function"]["name"]: t for t in sel.sent}
    assert by_name["zeta"] == stub_definition(TOOLS[0]) and by_name["mid"] == TOOLS[2]
    assert by_name["alpha"] == TOOLS[1]
    # once gamma is called it keeps the form it was sent in: the tool block is the same
    again = select_tools(TOOLS, CALLED, "auto", k=3, pinned=["alpha"], full=1, stubs=1,
                         similarity=[0.5, 0.1, 0.9, 0.3, 0.8])
    assert again.sent == sel.sent and again.reasons["gamma"] == "called"
    assert again.stubbed == sel.stubbed


def test_a_stub_brings_its_lookup_as_a_stub():
    from app.core.tool_select import prerequisites
    pre = prerequisites(CATALOGUE)
    names = [t["function"]["name"] for t in CATALOGUE]
    # read_email ranks second: it goes as the one stub, and search_emails (whose ids it
    # takes) goes with it as a stub, though it ranks last
    sims = [0.0] * len(CATALOGUE)
    sims[names.index("read_email")] = 0.5
    sims[names.index("get_weather")] = 0.9
    sel = select_tools(CATALOGUE, [], "auto", k=1, pinned=[], similarity=sims,
                       prerequisite=pre, stubs=1)
    assert sel.reasons == {"get_weather": "similar", "read_email": "stub",
                           "search_emails": "stub"}
    assert sel.stubbed == ["read_email", "search_emails"]


def test_past_the_stubs_the_next_best_scored_go_by_name_alone():
    from app.core.tool_select import name_definition, stub_definition
    sims = [0.5, 0.1, 0.9, 0.3, 0.0]          # mid, zeta, beta, alpha, gamma
    sel = select_tools(TOOLS, [], "auto", k=1, pinned=[], stubs=1, by_name=2,
                       similarity=sims)
    assert sel.reasons == {"mid": "similar", "zeta": "stub", "beta": "name",
                           "alpha": "name"}
    # both are retried with their full definitions when a call does not fit: "stubbed"
    assert sel.stubbed == ["zeta", "beta", "alpha"] and sel.named == ["beta", "alpha"]
    assert sel.dropped == ["gamma"]
    by_name = {t["function"]["name"]: t for t in sel.sent}
    assert list(by_name) == ["alpha", "beta", "mid", "zeta"]   # canonical order
    assert by_name["beta"] == name_definition(TOOLS[3]) == {
        "type": "function", "function": {"name": "beta"}}
    assert by_name["zeta"] == stub_definition(TOOLS[0]) and by_name["mid"] == TOOLS[2]
    # none by default, and the choice goes in full whatever its rank
    assert select_tools(TOOLS, [], "auto", k=1, pinned=[], stubs=1,
                        similarity=sims).named == []
    chose = select_tools(TOOLS, [], {"type": "function", "function": {"name": "beta"}},
                         k=1, pinned=[], stubs=1, by_name=2, similarity=sims)
    assert chose.reasons["beta"] == "choice" and chose.named == ["alpha", "gamma"]
    assert {t["function"]["name"]: t for t in chose.sent}["beta"] == TOOLS[3]


def test_a_tool_sent_by_name_brings_its_lookup_by_name():
    from app.core.tool_select import prerequisites
    names = [t["function"]["name"] for t in CATALOGUE]
    sims = [0.0] * len(CATALOGUE)
    sims[names.index("get_weather")] = 0.9
    sims[names.index("read_email")] = 0.5
    sel = select_tools(CATALOGUE, [], "auto", k=1, pinned=[], similarity=sims,
                       prerequisite=prerequisites(CATALOGUE), by_name=1)
    assert sel.reasons == {"get_weather": "similar", "read_email": "name",
                           "search_emails": "name"}
    assert sel.named == sel.stubbed == ["read_email", "search_emails"]


def test_two_stubs_sharing_a_lookup_list_it_once():
    names = [t["function"]["name"] for t in CATALOGUE]
    sims = [0.0] * len(CATALOGUE)
    sims[names.index("get_weather")] = 0.9
    sims[names.index("read_email")] = 0.5
    sims[names.index("send_email")] = 0.4
    pre = {"read_email": ["search_emails"], "send_email": ["search_emails"]}
    sel = select_tools(CATALOGUE, [], "auto", k=1, pinned=[], similarity=sims,
                       prerequisite=pre, stubs=2, by_name=1)
    assert sel.stubbed.count("search_emails") == 1
    assert sel.stubbed[:3] == ["read_email", "send_email", "search_emails"]
    assert sel.reasons["search_emails"] == "stub"
