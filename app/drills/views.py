"""Console pages of the drills area: history of every drill, running CD-28A here, and
queueing CD-28B (domain shift) and CD-28C (replica loss) for the workers."""
from __future__ import annotations

import io
from pathlib import Path

from flask import (Blueprint, current_app, flash, g, jsonify, redirect, render_template,
                   request, url_for)
from flask_login import current_user, login_required

from app.api.views import api_auth, body
from app.console.helpers import require
from app.drills.service import (list_runs, queue_domain_shift, queue_replica_loss,
                                require_drill_run)
from app.errors import ServiceError, ValidationError

bp = Blueprint("drills", __name__)
api_bp = Blueprint("drills_api", __name__)

REPLICA_LOSS_NUMBERS = {"pool_id": (int, None), "stop_count": (int, 2), "sessions": (int, 8),
                        "turns_before": (int, 3), "turns_after": (int, 4)}
DOMAIN_SHIFT_NUMBERS = {"n_ood": (int, 40), "n_control": (int, 20), "max_tokens": (int, 64),
                        "min_escalation_rate": (float, 0.5)}

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
                           gateway_url=current_app.config["GATEWAY_URL"],
                           running=any(r.status == "running" for r in runs))


def _numbers(spec: dict[str, tuple[type, object]], data=None) -> dict:
    """Form fields (or a JSON object's) as numbers (blank or absent: the default);
    ValueError on junk."""
    data = request.form if data is None else data
    out = {}
    for name, (conv, default) in spec.items():
        raw = data.get(name)
        if isinstance(raw, bool) or (conv is int and isinstance(raw, float)):
            raise ValueError(name)
        raw = raw.strip() if isinstance(raw, str) else raw
        out[name] = conv(raw) if raw not in (None, "") else default
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
def replica_loss():
    require("drill.run")
    try:
        nums = _numbers(REPLICA_LOSS_NUMBERS)
    except ValueError:
        flash("Pool, replicas to stop, sessions and turns must be whole numbers.", "error")
        return redirect(url_for("drills.index")), 303
    return _queued(queue_replica_loss, "Replica-loss drill queued on the pool's node; its "
                   "progress shows below.", url=(request.form.get("url") or "").strip(),
                   model=(request.form.get("model") or "auto").strip(), **nums)


@bp.route("/drills/domain-shift", methods=["POST"])
@login_required
def domain_shift():
    require("drill.run")
    try:
        nums = _numbers(DOMAIN_SHIFT_NUMBERS)
    except ValueError:
        flash("Prompt counts and max tokens must be whole numbers, the escalation rate a "
              "number.", "error")
        return redirect(url_for("drills.index")), 303
    return _queued(queue_domain_shift, "Domain-shift drill queued; it shows below once a "
                   "worker starts it.", url=(request.form.get("url") or "").strip(),
                   workflow=(request.form.get("workflow") or "drill-simple-extraction").strip(),
                   **_accuracy_tiers(request.form), **nums)


def _accuracy_tiers(data) -> dict[str, str]:
    """CD-28B's optional task-accuracy pass: the unmonitored and the reference tier."""
    out = {}
    for field in ("unmonitored_tier", "reference_tier"):
        value = data.get(field)
        if isinstance(value, str) and value.strip():
            out[field] = value.strip()[:64]
    return out


@bp.route("/drills/cache-poisoning", methods=["POST"])
@login_required
def cache_poisoning():
    require("drill.run")
    from app.cache.drill import PairError
    from app.cache.drill_runs import record_cache_poisoning
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
        run = record_cache_poisoning(lines, threshold=threshold, source=source,
                                     actor=current_user)
    except PairError as exc:
        flash(f"Bad pair file: {exc}", "error")
        return redirect(url_for("drills.index")), 303
    finally:
        lines.close()
    result = run.result
    flash(f"Cache-poisoning drill #{run.id}: {result['false_hits']} false hits, "
          f"true-hit rate {result['true_hit_rate']:.1%} over {result['pairs']} pairs.",
          "success" if result["false_hits"] == 0 else "error")
    return redirect(url_for("drills.index")), 303


# ------------------------------------------------------------------ admin API (/api/v1)

def _api_numbers(spec: dict[str, tuple[type, object]], data: dict) -> dict:
    try:
        return _numbers(spec, data)
    except (TypeError, ValueError):
        bad = [n for n, (conv, _) in spec.items() if not _is_number(data.get(n), conv)]
        raise ValidationError("invalid drill parameters",
                              {n: ["must be a number" if spec[n][0] is float else
                                   "must be a whole number"] for n in bad}) from None


def _is_number(raw, conv) -> bool:
    if raw in (None, ""):
        return True
    if isinstance(raw, bool) or (conv is int and isinstance(raw, float)):
        return False
    try:
        conv(raw)
    except (TypeError, ValueError):
        return False
    return True


def _text(data: dict, name: str, default: str = "") -> str:
    raw = data.get(name, default)
    if not isinstance(raw, str):
        raise ValidationError("invalid drill parameters", {name: ["must be text"]})
    return raw.strip()


@api_bp.get("/drills")
@api_auth
def api_list():
    """Drill runs, newest first (``?kind=cache-poisoning|domain-shift|replica-loss``)."""
    require_drill_run(g.api_user)
    runs = list_runs(kind=request.args.get("kind") or None, limit=100)
    return jsonify({"runs": [r.to_dict() for r in runs]})


@api_bp.post("/drills/cache-poisoning")
@api_auth
def api_cache_poisoning():
    """CD-28A, run now: ``{"pairs": [{"a", "b", "same", "kind"}, ...]}`` (absent: the
    bundled sample) and an optional ``"threshold"``; answers the drill's report."""
    from app.cache.drill import PairError
    from app.cache.drill_runs import record_cache_poisoning
    require_drill_run(g.api_user)
    data = body()
    threshold = data.get("threshold")
    if threshold is not None and (isinstance(threshold, bool)
                                  or not isinstance(threshold, (int, float))
                                  or not 0.0 <= threshold <= 1.0):
        raise ValidationError("invalid drill parameters",
                              {"threshold": ["must be a number between 0 and 1"]})
    pairs = data.get("pairs")
    if pairs is None:
        lines, source = SAMPLE_PAIRS.open(encoding="utf-8"), "sample"
    elif isinstance(pairs, list):
        import json
        lines, source = io.StringIO("\n".join(json.dumps(p) for p in pairs)), "api"
    else:
        raise ValidationError("invalid drill parameters",
                              {"pairs": ["must be a list of pair objects"]})
    try:
        run = record_cache_poisoning(lines, threshold=threshold, source=source,
                                     actor=g.api_user)
    except PairError as exc:
        raise ValidationError("invalid pairs", {"pairs": [str(exc)]}) from None
    finally:
        lines.close()
    return jsonify({**run.result, "run_id": run.id})


@api_bp.post("/drills/domain-shift")
@api_auth
def api_domain_shift():
    """CD-28B, queued for a worker: ``{"key": tenant API key, "url": gateway, "workflow",
    "n_ood", "n_control", "max_tokens", "min_escalation_rate"}`` and, for task accuracy
    with and without the monitor, ``"unmonitored_tier", "reference_tier"``; 202."""
    data = body()
    nums = _api_numbers(DOMAIN_SHIFT_NUMBERS, data)
    queue_domain_shift(g.api_user, _text(data, "key"), url=_text(data, "url"),
                       workflow=_text(data, "workflow", "drill-simple-extraction"),
                       **_accuracy_tiers(data), **nums)
    return jsonify({"queued": "domain-shift"}), 202


@api_bp.post("/drills/replica-loss")
@api_auth
def api_replica_loss():
    """CD-28C, queued on the pool's node: ``{"key", "url", "model", "pool_id", "stop_count",
    "sessions", "turns_before", "turns_after"}``; 202 with the run (progress in GET)."""
    data = body()
    nums = _api_numbers(REPLICA_LOSS_NUMBERS, data)
    run = queue_replica_loss(g.api_user, _text(data, "key"), url=_text(data, "url"),
                             model=_text(data, "model", "auto") or "auto", **nums)
    return jsonify(run.to_dict()), 202
