"""Security findings 9 and 14: malformed input gets a clear 4xx, never a 500 or an
off-site redirect."""
from __future__ import annotations

import httpx
import pytest

from tests.console.web import browser, csrf_from
from tests.factories import PASSWORD
from tests.factories import UserFactory


def _deep(n: int) -> dict:
    node: dict = {"type": "string"}
    for _ in range(n):
        node = {"type": "object", "properties": {"x": node}}
    return node


BAD_BODIES = [
    ("messages[0].role", {"messages": [{"role": {"x": 1}, "content": "hi"}]}),
    ("messages[0].role", {"messages": [{"role": ["user"], "content": "hi"}]}),
    ("messages[0].content[0]", {"messages": [{"role": "user", "content": [1]}]}),
    ("messages[0].content[0]", {"messages": [{"role": "user", "content": [{"text": "no type"}]}]}),
    ("messages[0].content[0].text",
     {"messages": [{"role": "user", "content": [{"type": "text", "text": {"a": 1}}]}]}),
    ("response_format", {"messages": [{"role": "user", "content": "hi"}],
                         "response_format": {"type": "json_schema", "json_schema": {
                             "name": "deep", "schema": _deep(300)}}}),
    ("tools", {"messages": [{"role": "user", "content": "hi"}],
               "tools": [{"type": "function", "function": {"name": "f",
                                                            "parameters": _deep(300)}}]}),
    # tools and tool_choice as OpenAI checks them (they reached retrieval and the engine)
    ("tools", {"messages": [{"role": "user", "content": "hi"}], "tools": {"f": 1}}),
    ("tools[0]", {"messages": [{"role": "user", "content": "hi"}],
                  "tools": [{"type": "function", "name": "f"}]}),
    ("tools[0].function.name", {"messages": [{"role": "user", "content": "hi"}],
                                "tools": [{"type": "function", "function": {}}]}),
    ("tools[0].function.name", {"messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "function", "function": {"name": "get weather"}}]}),
    ("tools[1].function.name", {"messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "function", "function": {"name": "f"}},
        {"type": "function", "function": {"name": "f"}}]}),
    ("tools[0].function.parameters", {"messages": [{"role": "user", "content": "hi"}],
                                      "tools": [{"type": "function", "function": {
                                          "name": "f", "parameters": "{}"}}]}),
    ("tool_choice", {"messages": [{"role": "user", "content": "hi"}],
                     "tools": [{"type": "function", "function": {"name": "f"}}],
                     "tool_choice": "always"}),
    ("tool_choice", {"messages": [{"role": "user", "content": "hi"}],
                     "tools": [{"type": "function", "function": {"name": "f"}}],
                     "tool_choice": {"type": "function", "function": {"name": "g"}}}),
    ("tool_choice", {"messages": [{"role": "user", "content": "hi"}],
                     "tool_choice": "required"}),
]


@pytest.mark.parametrize("param,body", BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_malformed_bodies_get_an_openai_style_400(world, param, body):
    r = httpx.post(world.base_url + "/chat/completions", timeout=30,
                   json={"model": "tier-1", **body},
                   headers={"authorization": f"Bearer {world.key}"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"


@pytest.mark.parametrize("target", ["/%09/evil.com", "/%0a/evil.com", "/%0d%0a/evil.com",
                                    "/\\evil.com", "//evil.com", "/%20/evil.com",
                                    "https://evil.com"])
def test_login_never_redirects_off_site(app, target):
    user = UserFactory(role="viewer")
    client = browser(app)
    page = client.get("/login?next=" + target)
    assert page.status_code == 200
    resp = client.post("/login?next=" + target, data={
        "email": user.email, "password": PASSWORD,
        "csrf_token": csrf_from(page.get_data(as_text=True))})
    assert resp.status_code == 302, resp.status_code
    location = resp.headers["Location"]
    assert location == "/" or location.startswith("http://localhost/"), location
