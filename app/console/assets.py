"""plotly.js from the installed plotly package (no CDN), read once per process."""
from __future__ import annotations

from functools import lru_cache

from flask import Response


@lru_cache(maxsize=1)
def _plotly_js() -> str:
    from plotly.offline import get_plotlyjs
    return get_plotlyjs()


def plotly_js_response(*, public: bool = True, max_age: int = 86400) -> Response:
    resp = Response(_plotly_js(), mimetype="application/javascript")
    if public:
        resp.cache_control.public = True
    else:
        resp.cache_control.private = True
    resp.cache_control.max_age = max_age
    return resp
