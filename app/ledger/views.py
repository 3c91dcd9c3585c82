"""Ledger dead letters: console page (``bp``) and admin API under ``/api/v1``
(``api_bp``). Thin: parse, call ``app.ledger.dead_letter``, render."""
from __future__ import annotations

from flask import Blueprint, flash, g, jsonify, redirect, render_template, request, url_for
from flask_login import current_user, login_required

from app.api.views import api_auth, body, int_arg
from app.ledger import dead_letter

bp = Blueprint("ledger", __name__, url_prefix="/ledger")
api_bp = Blueprint("ledger_api", __name__)


@bp.app_template_global("ledger_dead_letters")
def _dead_letter_count() -> int | None:
    """The dead-letter count for users who may replay them (None for the others, and
    when Redis cannot say)."""
    if not getattr(current_user, "is_authenticated", False) or \
            not current_user.can("budget.manage"):
        return None
    try:
        return dead_letter.count(current_user)
    except Exception:  # noqa: BLE001 - a page must not fail on an advisory count
        return None


@bp.route("/dead-letters")
@login_required
def dead_letters():
    return render_template("ledger/dead_letters.html",
                           count=dead_letter.count(current_user),
                           entries=dead_letter.listing(current_user, limit=100))


@bp.route("/dead-letters/replay", methods=["POST"])
@login_required
def dead_letters_replay():
    ids = request.form.getlist("id") or None
    out = dead_letter.replay(current_user, ids=ids)
    flash(f"Replayed {out['replayed']} dead letters: {out['stored']} rows stored, "
          f"{out['duplicates']} already in the ledger, {out['failed']} still failing.",
          "error" if out["failed"] else "info")
    return redirect(url_for("ledger.dead_letters"))


# ------------------------------------------------------------------ admin API (/api/v1)

@api_bp.get("/ledger/dead-letters")
@api_auth
def api_dead_letters():
    limit = int_arg("limit", 100, 1, dead_letter.LIST_MAX)
    return jsonify(count=dead_letter.count(g.api_user),
                   entries=dead_letter.listing(g.api_user, limit=limit))


@api_bp.post("/ledger/dead-letters/replay")
@api_auth
def api_dead_letters_replay():
    data = body() if request.get_data() else {}
    return jsonify(dead_letter.replay(g.api_user, ids=data.get("ids"),
                                      limit=data.get("limit", dead_letter.LIST_MAX)))
