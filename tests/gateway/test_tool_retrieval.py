"""Tool-definition retrieval through the gateway (policy ``tool_retrieval``): which tools
reach the upstream, what the ledger books, and the full-set retry when the model calls a
tool that was not sent. Real gateway, fake OpenAI upstreams, real MiniLM embeddings."""
from __future__ import annotations

import httpx
import pytest

from tests.gateway.conftest import World, health, make_world, off_path_gateway, wait_for

SPECS = {
    "get_weather": "Current weather and forecast for a city",
    "get_time": "Current local time in a timezone",
    "send_email": "Send an email to a recipient with a subject and body",
    "create_calendar_event": "Add a meeting to the user's calendar",
    "get_stock_price": "Latest stock market price for a ticker symbol",
    "translate_text": "Translate text into another language",
    "search_flights": "Search airline flights between two airports on a date",
    "book_hotel": "Reserve a hotel room in a city for given nights",
    "calculate": "Evaluate an arithmetic expression",
    "get_news": "Top news headlines on a topic",
    "play_music": "Play a song or playlist on the speaker",
    "find_recipe": "Find a cooking recipe for a dish",
}
TOOLS = [{"type": "function", "function": {
    "name": name, "description": desc,
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                   "required": ["query"]}}} for name, desc in SPECS.items()]
POLICY = {"tool_retrieval": True, "tool_retrieval_k": 3, "tool_retrieval_pinned": "calculate"}


def _sent(replica) -> list[str]:
    body = httpx.get(replica.url + "/stats").json()["last_body"]
    return [t["function"]["name"] for t in body.get("tools") or []]


def test_only_relevant_tools_go_up_in_canonical_order_and_the_ledger_books_the_saving(
        app, gateway, fake_replicas, frontier):
    w = make_world(app, gateway, [fake_replicas[0].url], frontier.url, policy=POLICY)
    client = w.client()
    earlier = [{"role": "user", "content": "How is AAPL doing?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "c1", "type": "function",
                    "function": {"name": "get_stock_price", "arguments": '{"query": "AAPL"}'}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "189.20"}]
    ask = {"role": "user", "content": "Will it rain in Paris tomorrow?"}
    client.chat.completions.create(model="tier-1", messages=[*earlier, ask], tools=TOOLS,
                                   temperature=0)
    sent = _sent(fake_replicas[0])
    # called earlier and pinned are never dropped; the weather tool is the similar one;
    # the 3 best scored (at most K_EXTRA more within the margin), none of the unrelated
    from app.gateway.tool_retrieval import K_EXTRA
    assert {"get_stock_price", "calculate", "get_weather"} <= set(sent)
    assert 3 <= len(set(sent) - {"get_stock_price", "calculate"}) <= 3 + K_EXTRA
    assert not {"play_music", "find_recipe", "translate_text"} & set(sent)
    assert sent == sorted(sent)
    # the tool named in tool_choice is kept too, past k
    client.chat.completions.create(
        model="tier-1", messages=[*earlier, ask], tools=list(reversed(TOOLS)), temperature=0,
        tool_choice={"type": "function", "function": {"name": "send_email"}})
    again = _sent(fake_replicas[0])
    assert {"send_email", "get_stock_price", "calculate"} <= set(again)
    assert again == sorted(again)   # the client's order does not move the tool block
    rows = w.drain_rows(2)
    for row in rows:
        assert row.tool_tokens > 0 and row.tool_tokens_saved > row.tool_tokens
        assert row.tool_retries == 0
        tools = row.payload["pipeline"]["tools"]
        assert tools["offered"] == 12 and tools["reasons"]["calculate"] == "pinned"
    assert rows[1].payload["pipeline"]["tools"]["reasons"]["send_email"] == "choice"
    # the console's workflows page shows the workflow's tool tokens sent and saved
    from tests.console.web import browser, login
    from tests.factories import UserFactory
    console = browser(app)
    login(console, UserFactory(role="admin").email)
    html = console.get("/workflows").get_data(as_text=True)
    row = html.split(f"<code>{rows[0].workflow[:12]}</code>", 1)[1].split("</tr>", 1)[0]
    mine = [r for r in rows if r.workflow == rows[0].workflow]
    sent, saved = sum(r.tool_tokens for r in mine), sum(r.tool_tokens_saved for r in mine)
    assert f"{sent:,}" in row and f"{saved:,} ({100 * saved / (sent + saved):.0f}%)" in row


def test_a_call_to_an_unsent_tool_is_retried_with_every_tool(app, gateway, fake_replicas,
                                                             frontier):
    w = make_world(app, gateway, [fake_replicas[0].url], frontier.url, policy=POLICY)
    r = w.client().chat.completions.create(
        model="tier-1", tools=TOOLS, temperature=0,
        messages=[{"role": "system", "content": "[[call-tool:play_music]]"},
                  {"role": "user", "content": "Weather in Oslo?"}])
    assert r.choices[0].message.tool_calls[0].function.name == "play_music"
    assert len(_sent(fake_replicas[0])) == 12   # the retry carried every tool
    row = w.drain_rows(1)[0]
    assert row.tool_retries == 1 and row.tool_tokens_saved == 0
    assert [a["reason"] for a in row.payload["attempts"]] == ["tool_retry"]
    assert row.payload["pipeline"]["tools"]["unsent_call"] == "play_music"


def test_without_the_policy_every_tool_goes_and_is_counted(app, gateway, fake_replicas,
                                                           frontier):
    w = make_world(app, gateway, [fake_replicas[0].url], frontier.url)
    w.client().chat.completions.create(model="tier-1", tools=TOOLS, temperature=0,
                                       messages=[{"role": "user", "content": "Hi"}])
    assert _sent(fake_replicas[0]) == list(SPECS)
    row = w.drain_rows(1)[0]
    assert row.tool_tokens > 12 * 20 and row.tool_tokens_saved == 0


STUB_POLICY = {"tool_retrieval": True, "tool_retrieval_k": 2, "tool_retrieval_stubs": 2}


def _full_tokens(tools) -> int:
    from app.contract.tokenizers import SMOLLM2, get_counter
    from app.gateway.tool_retrieval import _tokens
    return _tokens(tools, get_counter(SMOLLM2))   # the reference engine's pool counts so


def test_stubs_go_past_the_k_full_ones_and_the_ledger_books_full_less_stub(
        app, gateway, fake_replicas, frontier):
    w = make_world(app, gateway, [fake_replicas[0].url], frontier.url, policy=STUB_POLICY)
    w.client().chat.completions.create(
        model="tier-1", tools=TOOLS, temperature=0,
        messages=[{"role": "user", "content": "Will it rain in Paris tomorrow?"}])
    body = httpx.get(fake_replicas[0].url + "/stats").json()["last_body"]
    sent = {t["function"]["name"]: t for t in body["tools"]}
    row = w.drain_rows(1)[0]
    info = row.payload["pipeline"]["tools"]
    assert len(info["stubbed"]) == 2 and "get_weather" not in info["stubbed"]
    assert {info["reasons"][n] for n in info["stubbed"]} == {"stub"}
    assert list(sent) == sorted(sent) and len(sent) == 4 and "get_weather" in sent
    full = {t["function"]["name"]: t for t in TOOLS}
    for name, tool in sent.items():
        if name in info["stubbed"]:   # name, description, parameter types; no descriptions
            fn = tool["function"]
            assert fn["parameters"] == {"type": "object", "required": ["query"],
                                        "properties": {"query": {"type": "string"}}}
            assert fn["description"].split()[:3] == \
                full[name]["function"]["description"].split()[:3]
        else:
            assert tool == full[name]
    # sent (what went up) + saved (dropped tools in full, stubs' full less stub) = all 12
    assert row.tool_tokens == _full_tokens(body["tools"])
    assert row.tool_tokens + row.tool_tokens_saved == _full_tokens(TOOLS)
    assert row.tool_retries == 0


def test_a_stub_called_with_arguments_its_schema_takes_is_not_retried_else_it_is(
        app, gateway, fake_replicas, frontier):
    w = make_world(app, gateway, [fake_replicas[0].url], frontier.url, policy=STUB_POLICY)
    ask = {"role": "user", "content": "Will it rain in Paris tomorrow?"}
    w.client().chat.completions.create(model="tier-1", tools=TOOLS, temperature=0,
                                       messages=[ask])
    stub = w.drain_rows(1)[0].payload["pipeline"]["tools"]["stubbed"][0]
    r = w.client().chat.completions.create(
        model="tier-1", tools=TOOLS, temperature=0,
        messages=[{"role": "system", "content": f'[[call-tool:{stub} {{"query": "x"}}]]'},
                  ask])
    assert r.choices[0].message.tool_calls[0].function.name == stub
    row = w.drain_rows(2)[1]   # every row of the tenant so far, oldest first
    assert row.tool_retries == 0 and row.payload.get("attempts", []) == []
    # arguments the full schema rejects (its required "query" missing): sent again with
    # that tool's full definition in its place, the other stub still a stub; counted
    r = w.client().chat.completions.create(
        model="tier-1", tools=TOOLS, temperature=0,
        messages=[{"role": "system", "content": f"[[call-tool:{stub}]]"}, ask])
    assert r.choices[0].message.tool_calls[0].function.name == stub
    body = httpx.get(fake_replicas[0].url + "/stats").json()["last_body"]
    again = {t["function"]["name"]: t for t in body["tools"]}
    assert list(again) == sorted(again) and len(again) == 4
    assert again[stub] == next(t for t in TOOLS if t["function"]["name"] == stub)
    row = w.drain_rows(3)[2]
    info = row.payload["pipeline"]["tools"]
    assert row.tool_retries == 1 and info["stub_call"] == stub and "unsent_call" not in info
    assert [a["reason"] for a in row.payload["attempts"]] == ["tool_retry"]
    assert stub not in info["stubbed"] and len(info["stubbed"]) == 1
    assert row.tool_tokens == _full_tokens(body["tools"])
    assert row.tool_tokens + row.tool_tokens_saved == _full_tokens(TOOLS)


def test_past_the_stubs_tools_go_by_name_alone_and_a_misfit_call_gets_the_full_one(
        app, gateway, fake_replicas, frontier):
    policy = {**STUB_POLICY, "tool_retrieval_stubs": 1, "tool_retrieval_names": 3}
    w = make_world(app, gateway, [fake_replicas[0].url], frontier.url, policy=policy)
    ask = {"role": "user", "content": "Will it rain in Paris tomorrow?"}
    w.client().chat.completions.create(model="tier-1", tools=TOOLS, temperature=0,
                                       messages=[ask])
    body = httpx.get(fake_replicas[0].url + "/stats").json()["last_body"]
    sent = {t["function"]["name"]: t for t in body["tools"]}
    row = w.drain_rows(1)[0]
    info = row.payload["pipeline"]["tools"]
    named = info["named"]
    assert len(named) == 3 and {info["reasons"][n] for n in named} == {"name"}
    assert set(named) < set(info["stubbed"]) and len(info["stubbed"]) == 4
    assert list(sent) == sorted(sent) and len(sent) == 2 + 1 + 3
    for name in named:   # the name alone: no description, no parameters
        assert sent[name] == {"type": "function", "function": {"name": name}}
    # sent + saved (dropped in full; a stub's or a name's full definition less it) = all 12
    assert row.tool_tokens == _full_tokens(body["tools"])
    assert row.tool_tokens + row.tool_tokens_saved == _full_tokens(TOOLS)
    # a call with arguments the full schema takes is served; one it rejects is sent again
    # with that tool's full definition in its place, the other names still names
    one = named[0]
    r = w.client().chat.completions.create(
        model="tier-1", tools=TOOLS, temperature=0,
        messages=[{"role": "system", "content": f'[[call-tool:{one} {{"query": "x"}}]]'},
                  ask])
    assert r.choices[0].message.tool_calls[0].function.name == one
    assert w.drain_rows(2)[1].tool_retries == 0
    r = w.client().chat.completions.create(
        model="tier-1", tools=TOOLS, temperature=0,
        messages=[{"role": "system", "content": f"[[call-tool:{one}]]"}, ask])
    assert r.choices[0].message.tool_calls[0].function.name == one
    body = httpx.get(fake_replicas[0].url + "/stats").json()["last_body"]
    again = {t["function"]["name"]: t for t in body["tools"]}
    assert again[one] == next(t for t in TOOLS if t["function"]["name"] == one)
    assert all(again[n] == sent[n] for n in named[1:])
    row = w.drain_rows(3)[2]
    info = row.payload["pipeline"]["tools"]
    assert row.tool_retries == 1 and info["stub_call"] == one
    assert info["named"] == named[1:] and one not in info["stubbed"]
    assert row.tool_tokens + row.tool_tokens_saved == _full_tokens(TOOLS)


def test_with_tool_retrieval_full_the_other_best_scored_go_as_stubs(
        app, gateway, fake_replicas, frontier):
    policy = {**STUB_POLICY, "tool_retrieval_k": 3, "tool_retrieval_full": 1,
              "tool_retrieval_stubs": 1}
    w = make_world(app, gateway, [fake_replicas[0].url], frontier.url, policy=policy)
    w.client().chat.completions.create(
        model="tier-1", tools=TOOLS, temperature=0,
        messages=[{"role": "user", "content": "Will it rain in Paris tomorrow?"}])
    body = httpx.get(fake_replicas[0].url + "/stats").json()["last_body"]
    row = w.drain_rows(1)[0]
    info = row.payload["pipeline"]["tools"]
    full = [n for n, why in info["reasons"].items() if why != "stub"]
    assert full == ["get_weather"] and len(info["stubbed"]) >= 3   # 2 of the k, 1 more
    assert len(body["tools"]) == 1 + len(info["stubbed"])
    assert row.tool_tokens + row.tool_tokens_saved == _full_tokens(TOOLS)


def test_a_conversation_does_not_learn_from_its_own_earlier_turns():
    import numpy as np

    from app.core.tool_select import co_called_counts
    from app.gateway.tool_retrieval import WorkflowMemory
    memory, key = WorkflowMemory(), ("t", "w")
    memory.learn(key, "book a flight", np.array([1.0, 0.0]), ["search_flights"])
    memory.learn(key, "fly to Rome", np.array([0.8, 0.6]), ["search_flights", "book_flight"])
    assert len(memory.entries(key)) == 2
    assert [c for _, c in memory.entries(key, other_than="fly to Rome")] == \
        [("search_flights",)]
    assert co_called_counts(memory.entries(key, other_than="fly to Rome")) == {}
    assert co_called_counts(memory.entries(key)) == {"search_flights": {"book_flight": 1},
                                                     "book_flight": {"search_flights": 1}}


@pytest.fixture(scope="module")
def second_gateway(app_config, tmp_path_factory):
    """Another gateway process on the same Redis, as a second worker (or a restart) is."""
    s = off_path_gateway(app_config, tmp_path_factory, "second")
    yield s
    s.stop()


def test_what_one_gateway_process_learned_another_sends(app, gateway, second_gateway,
                                                        fake_replicas, frontier):
    w = make_world(app, gateway, [fake_replicas[0].url], frontier.url,
                   policy={**POLICY, "cache_enabled": False})
    version = health(gateway)["snapshot_version"]
    wait_for(lambda: (health(second_gateway).get("snapshot_version") or 0) >= version,
             what="the second gateway's snapshot")
    other = World(gateway=second_gateway, tenant=w.tenant, key=w.key, tiers=w.tiers,
                  pool=w.pool).client()
    ask = [{"role": "user", "content": "Will it rain in Paris tomorrow?"}]
    other.chat.completions.create(model="tier-1", messages=ask, tools=TOOLS, temperature=0)
    assert "play_music" not in _sent(fake_replicas[0])
    # through the first gateway, a conversation that asked alike called play_music
    w.client().chat.completions.create(model="tier-1", tools=TOOLS, temperature=0, messages=[
        {"role": "user", "content": "Will it rain in Paris tomorrow evening?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "play_music", "arguments": '{"query": "rain songs"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "playing"}])
    other.chat.completions.create(model="tier-1", messages=ask, tools=TOOLS, temperature=0)
    assert "play_music" in _sent(fake_replicas[0])   # learned in the other process


def _streamed_call(client, messages) -> tuple[str, str, list[str]]:
    """(tool name, arguments, finish reasons) of a streamed answer, as the SDK reads it."""
    name, args, finish = "", "", []
    for ev in client.chat.completions.create(model="tier-1", tools=TOOLS, temperature=0,
                                             messages=messages, stream=True):
        for ch in ev.choices:
            for tc in ch.delta.tool_calls or ():
                name += (tc.function.name or "") if tc.function else ""
                args += (tc.function.arguments or "") if tc.function else ""
            if ch.finish_reason:
                finish.append(ch.finish_reason)
    return name, args, finish


def test_a_streamed_call_to_an_unsent_or_misfit_tool_is_retried_before_the_client_sees_it(
        app, gateway, fake_replicas, frontier):
    """Streamed, a tool call is held until it is whole (an agent cannot act on half a
    call): a call to an unsent tool goes again with every tool, a stub called with
    arguments its schema rejects with its full definition, and a good call passes as the
    engine wrote it; text streams through unheld."""
    w = make_world(app, gateway, [fake_replicas[0].url], frontier.url, policy=STUB_POLICY)
    client = w.client()
    ask = {"role": "user", "content": "Will it rain in Paris tomorrow?"}
    name, args, finish = _streamed_call(client, [
        {"role": "system", "content": "[[call-tool:play_music]]"}, ask])
    assert (name, args, finish) == ("play_music", "{}", ["tool_calls"])
    assert len(_sent(fake_replicas[0])) == 12   # the retry carried every tool
    row = w.drain_rows(1)[0]
    info = row.payload["pipeline"]["tools"]
    assert row.tool_retries == 1 and info["unsent_call"] == "play_music"
    assert [a["reason"] for a in row.payload["attempts"]] == ["tool_retry"]
    assert row.tool_tokens + row.tool_tokens_saved == _full_tokens(TOOLS)

    text = "".join(ev.choices[0].delta.content or "" for ev in client.chat.completions.create(
        model="tier-1", tools=TOOLS, temperature=0, messages=[ask], stream=True)
        if ev.choices)
    assert text   # an answer in text passes through the hold
    stub = w.drain_rows(2)[1].payload["pipeline"]["tools"]["stubbed"][0]
    name, args, finish = _streamed_call(client, [
        {"role": "system", "content": f'[[call-tool:{stub} {{"query": "x"}}]]'}, ask])
    assert (name, args) == (stub, '{"query": "x"}')
    row = w.drain_rows(3)[2]
    assert row.tool_retries == 0 and row.payload.get("attempts", []) == []
    name, args, finish = _streamed_call(client, [
        {"role": "system", "content": f"[[call-tool:{stub}]]"}, ask])
    assert name == stub and finish == ["tool_calls"]
    again = {t["function"]["name"]: t for t in httpx.get(
        fake_replicas[0].url + "/stats").json()["last_body"]["tools"]}
    assert again[stub] == next(t for t in TOOLS if t["function"]["name"] == stub)
    row = w.drain_rows(4)[3]
    info = row.payload["pipeline"]["tools"]
    assert row.tool_retries == 1 and info["stub_call"] == stub
    assert [a["reason"] for a in row.payload["attempts"]] == ["tool_retry"]
