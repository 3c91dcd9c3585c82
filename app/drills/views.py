"""Console pages of the drills area: history of every drill, running CD-28A here, and
queueing CD-28B (domain shift) and CD-28C (replica loss) for the workers."""
from __future__ import annotations

import io
from pathlib import Path

from flask import Blueprint, current_app, flash, redirect, render_template, request, url_for
from flask_login import current_user, login_required

from app.console.helpers import require
from app.drills.service import list_runs, queue_domain_shift, queue_replica_loss
from app.errors import ServiceError

bp = Blueprint("drills", __name__)

SAMPLE_PAIRS = Path(__file__).resolve().parents[1] / "cache" / "data" / "cache_pairs_sample.jsonl"
MAX_UPLOAD_BYTES = 2 * 1024 * 1024


@bp.route("/drills")
@login_required
def index():
    require("drill.run")
    from app.catalog.service import list_pools
    kind = request.args.get("kind") or None
    runs = list_runs(kind=kind, limit=100)
    pools = [(p, sum(r.state == "healthy" for r in p.replicas)) for p in list_pools()]
    return render_template("drills/index.html", runs=runs, kind=kind, pools=pools,
                           gateway_url=current_app.config.get("GATEWAY_URL", ""),
                           running=any(r.status == "running" for r in runs))


def _numbers(spec: dict[str, tuple[type, object]]) -> dict:
    """Form fields as numbers (a blank field takes its default); ValueError on junk."""
    out = {}
    for name, (conv, default) in spec.items():
        raw = (request.form.get(name) or "").strip()
        out[name] = conv(raw) if raw else default
    return out


def _queued(start, message: str, **fixed):
    try:
        start(current_user, (request.form.get("key") or "").strip(), **fixed)
    except ServiceError as exc:
        flash("; ".join(f"{k}: {', '.join(v)}" for k, v in exc.errors.items()) or exc.message,
              "error")
    else:
        flash(message, "success")
    return redirect(url_for("drills.index")), 303


@bp.route("/drills/replica-loss", methods=["POST"])
@login_required
def start_replica_loss():
    require("drill.run")
    try:
        nums = _numbers({"pool_id": (int, None), "stop_count": (int, 2), "sessions": (int, 8),
                         "turns_before": (int, 3), "turns_after": (int, 4)})
    except ValueError:
        flash("Pool, replicas to stop, sessions and turns must be whole numbers.", "error")
        return redirect(url_for("drills.index")), 303
    return _queued(queue_replica_loss, "Replica-loss drill queued on the pool's node; its "
                   "progress shows below.", url=(request.form.get("url") or "").strip(),
                   model=(request.form.get("model") or "auto").strip(), **nums)


@bp.route("/drills/domain-shift", methods=["POST"])
@login_required
def start_domain_shift():
    require("drill.run")
    try:
        nums = _numbers({"n_ood": (int, 40), "n_control": (int, 20), "max_tokens": (int, 64),
                         "min_escalation_rate": (float, 0.5)})
    except ValueError:
        flash("Prompt counts and max tokens must be whole numbers, the escalation rate a "
              "number.", "error")
        return redirect(url_for("drills.index")), 303
    return _queued(queue_domain_shift, "Domain-shift drill queued; it shows below once a "
                   "worker starts it.", url=(request.form.get("url") or "").strip(),
                   workflow=(request.form.get("workflow") or "drill-simple-extraction").strip(),
                   **nums)


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
