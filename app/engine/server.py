"""The reference engine's HTTP API: the subset of vLLM's OpenAI server Sluice uses."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from app.engine import tools
from app.engine.core import Engine, EngineError, Job
from app.engine.scheduler import Scheduler


@dataclass
class ServerOptions:
    served_model_name: str
    enable_prompt_tokens_details: bool = True
    max_loras: int = 4
    max_tokens_default: int = 256
    enable_auto_tool_choice: bool = False  # vLLM's --enable-auto-tool-choice
    tool_call_parser: str = ""  # vLLM's --tool-call-parser (here: hermes)

    @property
    def api_key(self) -> str | None:
        """vLLM's ``--api-key`` / ``VLLM_API_KEY``: every /v1 route needs it as a bearer
        token (health and metrics stay open, as in vLLM)."""
        return os.environ.get("VLLM_API_KEY") or None

    @property
    def allow_runtime_lora(self) -> bool:
        # Read when the app is built (not at import), like vLLM reads its env at startup.
        return os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("true", "1")


def _error(message: str, status: int = 400, kind: str = "BadRequestError") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None,
                                   "code": status}}, status_code=status)


def _constraint(body: dict) -> dict | None:
    """The request's output constraint in ``response_format`` shape: OpenAI's
    ``response_format``, or vLLM's ``structured_outputs`` (``json``, ``json_object``,
    ``grammar`` in xgrammar's EBNF; the other kinds are not served here)."""
    rf, so = body.get("response_format"), body.get("structured_outputs")
    if so is None:
        return rf
    if not isinstance(so, dict):
        raise EngineError("structured_outputs must be an object")
    kinds = [k for k in ("json", "json_object", "grammar", "regex", "choice", "structural_tag")
             if so.get(k) not in (None, False)]
    if len(kinds) != 1:
        raise EngineError("structured_outputs must set exactly one of json, json_object, "
                          "grammar, regex, choice, structural_tag")
    if rf and (rf.get("type") or "text") != "text":
        raise EngineError("set response_format or structured_outputs, not both")
    kind, value = kinds[0], so[kinds[0]]
    if kind == "json":
        schema = json.loads(value) if isinstance(value, str) else value
        return {"type": "json_schema", "json_schema": {"schema": schema}}
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "grammar":
        if not isinstance(value, str) or not value.strip():
            raise EngineError("structured_outputs.grammar must be a non-empty string")
        return {"type": "grammar", "grammar": value}
    raise EngineError(f"structured_outputs.{kind} is not supported by the reference engine")


def _job_from_body(engine: Engine, body: dict, opts: ServerOptions, emit) -> Job:
    if not isinstance(body, dict):
        raise EngineError("request body must be a JSON object")
    model = body.get("model") or opts.served_model_name
    engine.check_model(model)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise EngineError("'messages' must be a non-empty list")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else list(stop)
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") \
        or opts.max_tokens_default
    temperature = body.get("temperature")
    top_logprobs = int(body.get("top_logprobs") or 0)
    if not 0 <= top_logprobs <= 20:
        raise EngineError("top_logprobs must be between 0 and 20")
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise EngineError("max_tokens must be a positive integer")
    plan = tools.plan_tools(body, auto_enabled=opts.enable_auto_tool_choice
                            and bool(opts.tool_call_parser))
    constraint = _constraint(body)
    if plan is not None and plan.constraint is not None:
        constraint = plan.constraint  # a forced call's schema wins, as in vLLM
    return Job(model=model, prompt_ids=engine.encode_chat(
                   [dict(m) for m in messages], plan.tools if plan else None),
               emit=emit, max_tokens=max_tokens,
               temperature=1.0 if temperature is None else float(temperature),
               top_p=float(body.get("top_p") or 1.0), stop=[str(s) for s in stop],
               seed=body.get("seed"), logprobs=bool(body.get("logprobs")),
               top_logprobs=top_logprobs, response_format=constraint,
               cache_salt=str(body.get("cache_salt") or ""),
               ignore_eos=bool(body.get("ignore_eos")),
               tool_plan=plan if plan is not None and plan.parses else None)


def create_app(load: Callable[[], Engine], opts: ServerOptions) -> Starlette:
    sched = Scheduler()

    async def health(request: Request) -> Response:
        if sched.healthy:
            return Response(status_code=200)
        return PlainTextResponse(sched.error or "loading", status_code=503)

    async def models(request: Request) -> Response:
        if not sched.healthy:
            return _error("engine not ready", 503, "ServiceUnavailableError")
        now = int(time.time())
        data = [{"id": opts.served_model_name, "object": "model", "created": now,
                 "owned_by": "sluice", "root": opts.served_model_name, "parent": None,
                 "max_model_len": sched.engine.max_model_len}]
        data += [{"id": name, "object": "model", "created": now, "owned_by": "sluice",
                  "root": path, "parent": opts.served_model_name}
                 for name, path in sched.engine.adapters.items()]
        return JSONResponse({"object": "list", "data": data})

    async def metrics(request: Request) -> Response:
        if sched.engine is None:
            return PlainTextResponse("", status_code=503)
        st = sched.stats()
        text = sched.engine.metrics.render(
            running=st["running"], waiting=st["waiting"],
            kv_usage=sched.engine.prefix_cache.usage, max_loras=opts.max_loras,
            running_adapters=[m for m in st["running_models"] if m in sched.engine.adapters],
            waiting_adapters=[m for m in st["waiting_models"] if m in sched.engine.adapters])
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def chat(request: Request) -> Response:
        if not sched.healthy:
            return _error(sched.error or "engine not ready", 503, "ServiceUnavailableError")
        try:
            body = await request.json()
        except ValueError:
            return _error("request body is not valid JSON")
        n = body.get("n") if isinstance(body, dict) else None
        if n is not None and n != 1:
            # one choice per request here: answering n > 1 with a single choice (as this
            # engine did) breaks a client that reads choices[1]; vLLM pools generate n
            return _error(f"n={n!r} is not supported by the reference engine: it generates "
                          "one choice per request (vLLM pools and frontier APIs take n)")
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def emit(ev: tuple) -> None:
            loop.call_soon_threadsafe(events.put_nowait, ev)
        try:
            job = _job_from_body(sched.engine, body, opts, emit)
            if job.response_format:
                sched.engine.grammar_for(job.response_format)  # reject bad schemas up front
        except EngineError as exc:
            return _error(str(exc), exc.status, exc.kind)
        except (TypeError, ValueError) as exc:
            return _error(f"invalid request: {exc}")
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        sched.submit(job)
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(
                _stream(events, job, rid, created, opts, include_usage),
                media_type="text/event-stream")
        return await _collect(events, job, rid, created, opts)

    async def load_lora(request: Request) -> Response:
        return await _lora_call(request, load=True)

    async def unload_lora(request: Request) -> Response:
        return await _lora_call(request, load=False)

    async def _lora_call(request: Request, load: bool) -> Response:
        if not sched.healthy:
            return _error("engine not ready", 503, "ServiceUnavailableError")
        try:
            body = await request.json()
        except ValueError:
            return _error("request body is not valid JSON")
        name, path = str(body.get("lora_name") or ""), str(body.get("lora_path") or "")
        if load:
            if len(sched.engine.adapters) >= opts.max_loras:
                return _error(f"at most {opts.max_loras} adapters (--max-loras)")
            fut = sched.call(lambda e: e.load_adapter(name, path))
        else:
            fut = sched.call(lambda e: e.unload_adapter(name))
        try:
            await asyncio.wrap_future(fut)
        except EngineError as exc:
            return _error(str(exc), exc.status, exc.kind)
        verb = "added" if load else "removed"
        return PlainTextResponse(f"Success: LoRA adapter '{name}' {verb} successfully.")

    routes = [Route("/health", health), Route("/v1/models", models),
              Route("/metrics", metrics),
              Route("/v1/chat/completions", chat, methods=["POST"])]
    if opts.allow_runtime_lora:
        routes += [Route("/v1/load_lora_adapter", load_lora, methods=["POST"]),
                   Route("/v1/unload_lora_adapter", unload_lora, methods=["POST"])]
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        sched.start(load)
        yield
        sched.stop()

    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.scheduler = sched
    key = opts.api_key
    if key:
        import hmac

        from starlette.middleware.base import BaseHTTPMiddleware

        async def require_key(request, call_next):
            if request.url.path.startswith("/v1/"):
                given = request.headers.get("authorization", "")
                if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
                    return JSONResponse({"error": "Unauthorized"}, status_code=401)
            return await call_next(request)
        app.add_middleware(BaseHTTPMiddleware, dispatch=require_key)
    return app


async def _collect(events: asyncio.Queue, job: Job, rid: str, created: int,
                   opts: ServerOptions) -> Response:
    parts: list[str] = []
    lps: list[dict] = []
    while True:
        ev = await events.get()
        if ev[0] == "token":
            parts.append(ev[1])
            if ev[2] is not None:
                lps.append(ev[2])
        elif ev[0] == "error":
            return _error(ev[1])
        else:
            break
    _, finish, usage = ev
    if not opts.enable_prompt_tokens_details:
        usage = {k: v for k, v in usage.items() if k != "prompt_tokens_details"}
    content, calls = "".join(parts), []
    if job.tool_plan is not None:
        content, calls = tools.parse_output(job.tool_plan, content)
        finish = _tool_finish(job.tool_plan, bool(calls), finish)
    return JSONResponse({
        "id": rid, "object": "chat.completion", "created": created, "model": job.model,
        "choices": [{"index": 0,
                     "message": {"role": "assistant", "content": content,
                                 "tool_calls": calls},
                     "logprobs": {"content": lps} if job.logprobs else None,
                     "finish_reason": finish, "stop_reason": None}],
        "usage": usage})


async def _stream(events: asyncio.Queue, job: Job, rid: str, created: int,
                  opts: ServerOptions, include_usage: bool):
    def chunk(delta: dict, finish: str | None = None, logprobs: Any = None,
              usage: dict | None = None, choices: bool = True) -> str:
        payload: dict[str, Any] = {"id": rid, "object": "chat.completion.chunk",
                                   "created": created, "model": job.model}
        payload["choices"] = [{"index": 0, "delta": delta, "logprobs": logprobs,
                               "finish_reason": finish}] if choices else []
        if usage is not None:
            payload["usage"] = usage
        return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"

    calls = tools.ToolCallStream(job.tool_plan) if job.tool_plan is not None else None
    try:
        yield chunk({"role": "assistant", "content": ""})
        while True:
            ev = await events.get()
            if ev[0] == "token" and calls is not None:
                _, delta, lp = ev
                for d in calls.feed(delta):
                    yield chunk(d, logprobs={"content": [lp]} if lp is not None else None)
                    lp = None
            elif ev[0] == "token":
                _, delta, lp = ev
                if delta or lp is not None:
                    yield chunk({"content": delta},
                                logprobs={"content": [lp]} if lp is not None else None)
            elif ev[0] == "error":
                yield f"data: {json.dumps({'error': {'message': ev[1], 'code': 400}})}\n\n"
                break
            else:
                _, finish, usage = ev
                if not opts.enable_prompt_tokens_details:
                    usage = {k: v for k, v in usage.items() if k != "prompt_tokens_details"}
                if calls is not None:
                    for d in calls.finish():
                        yield chunk(d)
                    finish = _tool_finish(job.tool_plan, calls.called, finish)
                yield chunk({}, finish)
                if include_usage:
                    yield chunk({}, usage=usage, choices=False)
                break
        yield "data: [DONE]\n\n"
    finally:
        job.cancelled.set()  # client went away (or we are done): stop generating


def _tool_finish(plan: "tools.ToolPlan", called: bool, finish: str) -> str:
    """OpenAI's finish_reason: ``tool_calls`` when the model chose to call (auto,
    required); a named choice keeps ``stop``, as OpenAI and vLLM answer it."""
    if called and plan.mode in ("auto", "required") and finish == "stop":
        return "tool_calls"
    return finish
