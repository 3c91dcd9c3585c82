"""The reference engine over real HTTP, with a tiny random Llama."""
from __future__ import annotations

import json

import httpx
import jsonschema


def _text(resp: httpx.Response) -> str:
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]["message"]["content"]


def _stream(eng, content: str, **kw) -> list[dict]:
    body = {"model": eng.name, "messages": [{"role": "user", "content": content}],
            "temperature": 0, "max_tokens": 12, "stream": True, **kw}
    chunks = []
    with httpx.stream("POST", f"{eng.url}/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[6:]
                chunks.append("DONE" if data == "[DONE]" else json.loads(data))
    return chunks


def test_models_and_health(tiny_engine):
    assert httpx.get(f"{tiny_engine.url}/health").status_code == 200
    ids = [m["id"] for m in httpx.get(f"{tiny_engine.url}/v1/models").json()["data"]]
    assert ids[0] == "tiny"


def test_greedy_generation_is_deterministic_and_counts_tokens(tiny_engine):
    a = tiny_engine.chat("hello there", max_tokens=10)
    b = tiny_engine.chat("hello there", max_tokens=10)
    assert _text(a) == _text(b) and _text(a)
    body = a.json()
    assert body["object"] == "chat.completion" and body["model"] == "tiny"
    usage = body["usage"]
    assert usage["completion_tokens"] <= 10 and usage["prompt_tokens"] > 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    if usage["completion_tokens"] == 10:
        assert body["choices"][0]["finish_reason"] == "length"


def test_unknown_model_is_404_like_vllm(tiny_engine):
    r = httpx.post(f"{tiny_engine.url}/v1/chat/completions",
                   json={"model": "nope", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 404
    assert "does not exist" in r.json()["error"]["message"]


def test_n_above_one_is_refused_not_answered_with_one_choice(tiny_engine):
    """By hand through the gateway, n=3 came back with one choice: the engine ignored n.
    It now says it generates one choice per request; n=1 still serves."""
    url, msgs = f"{tiny_engine.url}/v1/chat/completions", [{"role": "user", "content": "x"}]
    r = httpx.post(url, json={"model": tiny_engine.name, "messages": msgs, "n": 3})
    assert r.status_code == 400 and "one choice per request" in r.json()["error"]["message"]
    one = httpx.post(url, json={"model": tiny_engine.name, "messages": msgs, "n": 1,
                                "max_tokens": 4})
    assert one.status_code == 200 and len(one.json()["choices"]) == 1


def test_an_image_part_is_refused_not_dropped(tiny_engine):
    """By hand, an image_url part reached this text-only engine and was dropped: the
    model answered about a picture it never saw. Text parts still join."""
    url = f"{tiny_engine.url}/v1/chat/completions"
    image = {"type": "image_url", "image_url": {"url": "http://example.invalid/a.png"}}
    for messages in ([{"role": "user", "content": [{"type": "text", "text": "what is it?"},
                                                   image]}],
                     [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None,
                      "tool_calls": [{"id": "c", "type": "function", "function": {
                          "name": "f", "arguments": "{}"}}]},
                      {"role": "tool", "tool_call_id": "c", "content": [image]}]):
        r = httpx.post(url, json={"model": tiny_engine.name, "messages": messages})
        assert r.status_code == 400, r.text
        assert "'image_url' is not supported" in r.json()["error"]["message"]
    ok = httpx.post(url, json={"model": tiny_engine.name, "max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"text": "b"}]}]})
    assert ok.status_code == 200, ok.text


def test_seeded_sampling_repeats(tiny_engine):
    kw = {"temperature": 1.0, "seed": 1234, "max_tokens": 12}
    assert _text(tiny_engine.chat("tell me", **kw)) == _text(tiny_engine.chat("tell me", **kw))


def test_stop_string_truncates_output(tiny_engine):
    full = _text(tiny_engine.chat("count please", max_tokens=24))
    assert len(full) > 6
    stop = full[len(full) // 2: len(full) // 2 + 3]
    cut = tiny_engine.chat("count please", max_tokens=24, stop=[stop]).json()
    assert cut["choices"][0]["finish_reason"] == "stop"
    assert cut["choices"][0]["message"]["content"] == full[:full.index(stop)]


def test_streaming_matches_non_streaming(tiny_engine):
    full = _text(tiny_engine.chat("stream me", max_tokens=12))
    chunks = _stream(tiny_engine, "stream me", stream_options={"include_usage": True})
    assert chunks[-1] == "DONE"
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1]
                   if c["choices"])
    assert text == full
    finishes = [c["choices"][0]["finish_reason"] for c in chunks[:-1] if c["choices"]]
    assert finishes[-1] in ("stop", "length")
    assert chunks[-2]["usage"]["completion_tokens"] > 0


def test_logprobs_top2_in_openai_chat_format(tiny_engine):
    body = tiny_engine.chat("margins", max_tokens=6, logprobs=True, top_logprobs=2).json()
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == body["usage"]["completion_tokens"]
    for item in content:
        top = item["top_logprobs"]
        assert len(top) == 2 and top[0]["logprob"] >= top[1]["logprob"]
        # greedy: the chosen token is the most likely one
        assert item["token"] == top[0]["token"] and item["logprob"] == top[0]["logprob"]
        assert item["logprob"] <= 0 and bytes(item["bytes"]).decode() == item["token"]


def test_json_schema_output_is_valid_even_from_a_random_model(tiny_engine):
    schema = {"type": "object",
              "properties": {"color": {"enum": ["red", "green", "blue"]},
                             "urgent": {"type": "boolean"},
                             "tags": {"type": "array", "items": {"enum": ["a", "b"]},
                                      "maxItems": 3}},
              "required": ["color", "urgent", "tags"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "ticket", "schema": schema}}
    for prompt in ("classify this", "another ticket"):
        r = tiny_engine.chat(prompt, max_tokens=60, response_format=fmt)
        jsonschema.validate(json.loads(_text(r)), schema)
        assert r.json()["choices"][0]["finish_reason"] == "stop"
    # without the grammar the same random model does not produce this JSON
    free = _text(tiny_engine.chat("classify this", max_tokens=60))
    try:
        jsonschema.validate(json.loads(free), schema)
        raise AssertionError("unconstrained output was already valid")
    except (ValueError, jsonschema.ValidationError):
        pass


def test_json_object_mode_and_bad_schema(tiny_engine):
    r = tiny_engine.chat("obj", max_tokens=40, temperature=0,
                         response_format={"type": "json_object"})
    body = r.json()
    if body["choices"][0]["finish_reason"] == "stop":
        json.loads(_text(r))
    else:  # ran out of tokens inside the object: still a JSON prefix, starting an object
        assert _text(r).lstrip().startswith("{")
    bad = tiny_engine.chat("x", response_format={"type": "json_schema",
                                                 "json_schema": {"name": "x", "schema": 3}})
    assert bad.status_code == 400


def test_prefix_cache_hits_are_counted_in_usage_and_metrics(tiny_engine):
    system = {"role": "system", "content": "You are a support bot. " * 30}
    q0 = tiny_engine.metric("vllm:prefix_cache_queries_total")
    h0 = tiny_engine.metric("vllm:prefix_cache_hits_total")
    first = tiny_engine.chat([system, {"role": "user", "content": "first question"}]).json()
    second = tiny_engine.chat([system, {"role": "user", "content": "second one"}]).json()
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 128 and cached % 16 == 0 and cached < second["usage"]["prompt_tokens"]
    assert tiny_engine.metric("vllm:prefix_cache_hits_total") - h0 == cached
    queried = first["usage"]["prompt_tokens"] + second["usage"]["prompt_tokens"]
    assert tiny_engine.metric("vllm:prefix_cache_queries_total") - q0 == queried
    assert 0 < tiny_engine.metric("vllm:kv_cache_usage_perc") <= 1
    # a cache hit gives the same answer as a cold computation would
    salted = tiny_engine.chat([system, {"role": "user", "content": "second one"}],
                              cache_salt="tenant-b").json()
    assert salted["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert salted["choices"][0]["message"] == second["choices"][0]["message"]


def test_metrics_use_vllm_names(tiny_engine):
    tiny_engine.chat("metrics please", max_tokens=2)
    text = httpx.get(f"{tiny_engine.url}/metrics").text
    for name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "vllm:kv_cache_usage_perc", "vllm:num_requests_running",
                 "vllm:num_requests_waiting", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:spec_decode_num_draft_tokens_total",
                 "vllm:spec_decode_num_accepted_tokens_total", "vllm:lora_requests_info"):
        assert name in text, name
    assert tiny_engine.metric("vllm:time_to_first_token_seconds_count") >= 1


def test_one_forward_at_a_time_queues_show_as_waiting(tiny_engine):
    import threading
    import time
    body = {"model": "tiny", "messages": [{"role": "user", "content": "long"}],
            "max_tokens": 3000, "temperature": 0, "ignore_eos": True, "stream": True}
    streams, stop = [], threading.Event()

    def hold_open() -> None:
        with httpx.stream("POST", f"{tiny_engine.url}/v1/chat/completions", json=body,
                          timeout=120) as r:
            streams.append(r.status_code)
            for _ in r.iter_lines():
                if stop.is_set():
                    break  # closing the stream aborts the generation

    threads = [threading.Thread(target=hold_open) for _ in range(2)]
    for t in threads:
        t.start()
        time.sleep(0.2)
    try:
        seen = False
        for _ in range(100):
            if (tiny_engine.metric("vllm:num_requests_running") == 1
                    and tiny_engine.metric("vllm:num_requests_waiting") == 1):
                seen = True
                break
            time.sleep(0.05)
        assert seen, "never saw one running and one waiting request"
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert streams == [200, 200]
    for _ in range(100):
        if tiny_engine.metric("vllm:num_requests_running") == 0 and \
                tiny_engine.metric("vllm:num_requests_waiting") == 0:
            break
        time.sleep(0.05)
    assert tiny_engine.metric("vllm:num_requests_running") == 0
    assert tiny_engine.metric("vllm:num_requests_waiting") == 0


def test_structured_outputs_grammar_and_json_as_vllm_takes_them(tiny_engine):
    """vLLM's per-request ``structured_outputs``: an xgrammar EBNF grammar (what S02 sends
    a pool for compact JSON) holds the random model to compact separators; ``json`` is
    the schema form; unsupported kinds and two constraints at once are 400s."""
    from app.core.minify_compact import compact_grammar
    schema = {"type": "object", "properties": {"color": {"enum": ["red", "green"]},
                                               "urgent": {"type": "boolean"},
                                               "tags": {"type": "array", "maxItems": 2,
                                                        "items": {"enum": ["a", "b"]}}},
              "required": ["color", "urgent", "tags"], "additionalProperties": False}
    r = tiny_engine.chat("classify", max_tokens=60, structured_outputs={
        "grammar": compact_grammar(schema)})
    text = _text(r)
    assert r.json()["choices"][0]["finish_reason"] == "stop", text
    value = json.loads(text)
    jsonschema.validate(value, schema)
    assert text == json.dumps(value, separators=(",", ":")), text   # compact, nothing else
    # the same schema through response_format gets xgrammar's default ", " and ": "
    spaced = _text(tiny_engine.chat("classify", max_tokens=60, response_format={
        "type": "json_schema", "json_schema": {"name": "t", "schema": schema}}))
    assert spaced == json.dumps(json.loads(spaced)), spaced
    as_json = _text(tiny_engine.chat("classify", max_tokens=60,
                                     structured_outputs={"json": schema}))
    jsonschema.validate(json.loads(as_json), schema)

    for bad in ({"regex": "[a-z]+"}, {"grammar": "root ::= (", "json": schema}, {},
                {"grammar": "root ::= ("}):
        resp = tiny_engine.chat("x", structured_outputs=bad)
        assert resp.status_code == 400, (bad, resp.text)
        assert resp.json()["error"]["message"]
    both = tiny_engine.chat("x", structured_outputs={"json": schema}, response_format={
        "type": "json_schema", "json_schema": {"name": "t", "schema": schema}})
    assert both.status_code == 400 and "not both" in both.json()["error"]["message"]
