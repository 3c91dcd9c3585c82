"""Error handlers: JSON for the admin API, HTML pages for the console."""
from __future__ import annotations

from flask import Flask, jsonify, render_template, request
from flask_wtf.csrf import CSRFError

from app.errors import ServiceError


def _wants_json() -> bool:
    return request.path.startswith("/api/")


def register(app: Flask) -> None:
    @app.errorhandler(ServiceError)
    def service_error(exc: ServiceError):
        if _wants_json():
            return jsonify(error={"code": exc.code, "message": exc.message,
                                  "fields": exc.errors}), exc.status
        return render_template("error.html", status=exc.status, message=exc.message), exc.status

    @app.errorhandler(CSRFError)
    def csrf_error(exc: CSRFError):
        return render_template("error.html", status=400,
                               message="The form expired or was not sent from this site "
                                       "(missing CSRF token). Reload the page and try again."), 400

    for status, message in ((400, "Bad request"), (403, "You do not have permission to do this"),
                            (404, "Not found"), (405, "Method not allowed"),
                            (500, "Internal error")):
        def handler(exc, status=status, message=message):
            if _wants_json():
                return jsonify(error={"code": str(status), "message": message,
                                      "fields": {}}), status
            return render_template("error.html", status=status, message=message), status
        app.register_error_handler(status, handler)
