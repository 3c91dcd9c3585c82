"""Domain exceptions raised by services; the edges (console, API) map them to HTTP."""
from __future__ import annotations


class ServiceError(Exception):
    status = 400
    code = "bad_request"

    def __init__(self, message: str, errors: dict[str, list[str]] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.errors = errors or {}


class ValidationError(ServiceError):
    status = 422
    code = "validation_error"


class NotFound(ServiceError):
    status = 404
    code = "not_found"


class Forbidden(ServiceError):
    status = 403
    code = "forbidden"


class TooManyAttempts(ServiceError):
    status = 429
    code = "too_many_attempts"


class Conflict(ServiceError):
    status = 409
    code = "conflict"
