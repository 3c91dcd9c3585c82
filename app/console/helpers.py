"""Small helpers shared by the console views: permission checks and form handling."""
from __future__ import annotations

from typing import Any

from flask import abort, render_template, request
from flask_login import current_user

from app.errors import ServiceError


def require(permission: str, tenant_id: int | None = None) -> None:
    """Abort with 403 unless the signed-in user may do ``permission``."""
    if not current_user.can(permission, tenant_id):
        abort(403)


def form_data(*fields: str) -> dict[str, Any]:
    """The submitted form as a plain dict (only ``fields`` when given; unchecked boxes are
    absent from a browser's form, so a listed checkbox field reads as "off")."""
    if not fields:
        return {k: v for k, v in request.form.items() if k != "csrf_token"}
    return {f: request.form.get(f, "") for f in fields}


def checkbox(name: str) -> bool:
    return request.form.get(name) in ("on", "1", "true", "y", "yes")


def render_errors(template: str, exc: ServiceError, **context: Any):
    """Re-render ``template`` with the service's field errors and its 4xx status."""
    context.pop("errors", None)
    return render_template(template, errors=exc.errors, error_message=exc.message,
                           **context), exc.status
