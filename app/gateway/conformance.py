"""What OpenAI's clients expect of every answer, whatever route (or none) produced it.

- ``x-request-id`` on every response (the official SDKs read it into ``_request_id``): the
  request's Sluice id where a handler set ``x-sluice-request-id``, else a fresh one.
- Unknown paths and methods answer OpenAI-shaped JSON errors (404, 405 with ``allow``),
  not Starlette's plain-text bodies.
"""
from __future__ import annotations

import uuid

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from app.gateway.errors import GatewayError

_SLUICE_ID = b"x-sluice-request-id"
_REQUEST_ID = b"x-request-id"


class RequestIdMiddleware:
    """Pure ASGI: adds ``x-request-id`` to the response head; the body streams untouched."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_id(message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers") or ())
                names = {k.lower(): v for k, v in headers}
                if _REQUEST_ID not in names:
                    rid = names.get(_SLUICE_ID) or uuid.uuid4().hex.encode()
                    headers.append((_REQUEST_ID, rid))
                    message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_id)


async def http_error(request: Request, exc: HTTPException) -> Response:
    """Starlette's routing errors (404 unknown path, 405 wrong method) as OpenAI errors."""
    if exc.status_code == 405:
        err = GatewayError(405, f"Method {request.method} is not allowed on {request.url.path}.",
                           code="method_not_allowed", type_="invalid_request_error",
                           headers=dict(exc.headers or {}))
    elif exc.status_code == 404:
        err = GatewayError(404, f"Unknown path {request.url.path}: this gateway serves "
                                "/v1/chat/completions, /v1/models and /v1/feedback.",
                           code="unknown_url")
    else:
        err = GatewayError(exc.status_code, str(exc.detail), headers=dict(exc.headers or {}))
    return err.response()


EXCEPTION_HANDLERS = {404: http_error, 405: http_error}
