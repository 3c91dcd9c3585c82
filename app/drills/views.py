"""Console pages of the drills area: history of every drill, and running CD-28A."""
from __future__ import annotations

import io
from pathlib import Path

from flask import Blueprint, flash, redirect, render_template, request, url_for
from flask_login import current_user, login_required

from app.console.helpers import require
from app.drills.service import list_runs

bp = Blueprint("drills", __name__)

SAMPLE_PAIRS = Path(__file__).resolve().parents[1] / "cache" / "data" / "cache_pairs_sample.jsonl"
MAX_UPLOAD_BYTES = 2 * 1024 * 1024


@bp.route("/drills")
@login_required
def index():
    require("drill.run")
    kind = request.args.get("kind") or None
    return render_template("drills/index.html", runs=list_runs(kind=kind, limit=100), kind=kind)


@bp.route("/drills/cache-poisoning", methods=["POST"])
@login_required
def run_cache_poisoning():
    require("drill.run")
    from app.cache.drill import PairError
    from app.cache.runs import run_drill_file
    raw_threshold = (request.form.get("threshold") or "").strip()
    try:
        threshold = float(raw_threshold) if raw_threshold else None
        if threshold is not None and not 0.0 <= threshold <= 1.0:
            raise ValueError
    except ValueError:
        flash("Threshold must be a number between 0 and 1.", "error")
        return redirect(url_for("drills.index")), 303
    upload = request.files.get("pairs")
    if upload is not None and upload.filename:
        data = upload.read(MAX_UPLOAD_BYTES + 1)
        if len(data) > MAX_UPLOAD_BYTES:
            flash("The pair file is larger than 2 MiB.", "error")
            return redirect(url_for("drills.index")), 303
        lines, source = io.StringIO(data.decode("utf-8", errors="replace")), upload.filename
    else:
        lines, source = SAMPLE_PAIRS.open(encoding="utf-8"), "sample"
    try:
        result = run_drill_file(lines, threshold=threshold, source=source, actor=current_user)
    except PairError as exc:
        flash(f"Bad pair file: {exc}", "error")
        return redirect(url_for("drills.index")), 303
    finally:
        lines.close()
    flash(f"Cache-poisoning drill #{result['run_id']}: {result['false_hits']} false hits, "
          f"true-hit rate {result['true_hit_rate']:.1%} over {result['pairs']} pairs.",
          "success" if result["false_hits"] == 0 else "error")
    return redirect(url_for("drills.index")), 303
