"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}``."""
from __future__ import annotations

import orjson
from starlette.responses import Response

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "invalid_request_error", 413: "invalid_request_error",
          429: "rate_limit_error", 502: "upstream_error", 503: "service_unavailable",
          504: "upstream_timeout"}


class GatewayError(Exception):
    """A request the gateway answers with an error; raised anywhere, rendered at the edge."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, type_: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type_ or _TYPES.get(status, "api_error")
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def response(self, headers: dict[str, str] | None = None) -> Response:
        return Response(orjson.dumps(self.body()), status_code=self.status,
                        media_type="application/json", headers={**self.headers, **(headers or {})})


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> GatewayError:
    return GatewayError(400, message, param=param, code=code)
