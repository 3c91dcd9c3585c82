"""``flask --app wsgi drill domain-shift`` (CD-28B), ``flask --app wsgi router ...`` (the
S01 cascade router; the command group keeps its name) and ``flask --app wsgi sluice
calibrate-gamma`` (S04's γ per tier, issue 24)."""
from __future__ import annotations

import json

import click
from flask.cli import AppGroup

from app.commands import sluice_cli
from app.drills.cli import drill_cli

router_cli = AppGroup("router", help="Cascade router models")


def groups() -> list:
    return [router_cli]


@drill_cli.command("domain-shift")
@click.option("--url", required=True, help="Gateway base URL, e.g. http://127.0.0.1:8080")
@click.option("--key", required=True, envvar="SLUICE_DRILL_KEY", help="Tenant API key")
@click.option("--workflow", default="drill-simple-extraction", show_default=True,
              help="X-Sluice-Workflow of the simple workflow (one older than frontier_first_hours"
                   ", or every request goes to the frontier)")
@click.option("--n", "n_ood", default=40, show_default=True, help="Out-of-domain prompts")
@click.option("--control", "n_control", default=20, show_default=True, help="In-domain prompts")
@click.option("--max-tokens", default=64, show_default=True)
@click.option("--timeout", "timeout_s", default=120.0, show_default=True)
@click.option("--ledger-wait", default=15.0, show_default=True,
              help="Seconds to wait for ledger rows when the gateway sends no escalation header")
@click.option("--min-escalation-rate", default=0.5, show_default=True)
@click.option("--accuracy-tier", "unmonitored_tier", default=None,
              help="Also measure task accuracy: the tier the router sends the workflow to, "
                   "asked by name (no margin monitor), against --reference-tier's answers")
@click.option("--reference-tier", default=None,
              help="The tier whose answers judge accuracy (the frontier, e.g. tier-3)")
def domain_shift(url, key, workflow, n_ood, n_control, max_tokens, timeout_s, ledger_wait,
                 min_escalation_rate, unmonitored_tier, reference_tier):
    """CD-28B: inject complex out-of-domain prompts into a simple workflow; report the
    escalation rate, the added latency, and whether any aborted-tier byte reached the client."""
    from app.errors import ValidationError
    from app.cascade.drill_runs import record_domain_shift
    try:
        run = record_domain_shift(url, key, workflow=workflow, n_ood=n_ood,
                                  n_control=n_control, max_tokens=max_tokens,
                                  timeout_s=timeout_s, ledger_wait_s=ledger_wait,
                                  min_escalation_rate=min_escalation_rate,
                                  unmonitored_tier=unmonitored_tier,
                                  reference_tier=reference_tier)
    except ValidationError as exc:
        raise click.UsageError("; ".join(f"{k}: {', '.join(v)}" for k, v in exc.errors.items()))
    if run.status == "error":
        raise click.ClickException(f"drill #{run.id} failed: {run.result.get('error')}")
    result = {k: v for k, v in run.result.items() if k != "requests"}
    click.echo(json.dumps(result, indent=2, default=str))
    o = result["ood"]
    rate = o["escalation_rate"]
    added = result["added_latency_ms"]
    click.echo(f"drill #{run.id} {run.status}: out-of-domain escalation "
               f"{'n/a' if rate is None else f'{rate:.1%}'} ({o['escalated']}/{o['escalation_known']}),"
               f" added latency {'n/a' if added is None else f'{added:.0f} ms'}, "
               f"aborted-tier bytes to client: {result['aborted_tier_bytes_to_client']}")
    acc = result.get("accuracy")
    if acc and "error" not in acc:
        def pct(v):
            return "n/a" if v is None else f"{v:.1%}"
        w, wo = acc["with_monitor"], acc["without_monitor"]
        click.echo(f"task accuracy (judged by {acc['judged_by']}'s answers): with the monitor "
                   f"{pct(w['all'])} (out-of-domain {pct(w['ood'])}, control "
                   f"{pct(w['control'])}); without ({acc['unmonitored_tier']} alone) "
                   f"{pct(wo['all'])} (out-of-domain {pct(wo['ood'])}, control "
                   f"{pct(wo['control'])})")
    elif acc:
        click.echo(f"task accuracy not measured: {acc['error']}")


@router_cli.command("train")
@click.argument("scope")
def train(scope):
    """Train a router version for SCOPE from its ledger traces (what the task does)."""
    from app.cascade.traces import train_from_ledger
    click.echo(json.dumps(train_from_ledger(scope), indent=2))


@router_cli.command("publish")
def publish():
    """Re-publish every active router to Redis."""
    from app.cascade.service import publish_all
    click.echo(f"published {publish_all()} scopes")


@sluice_cli.command("calibrate-gamma")
@click.option("--tier", "tier_ref", required=True, help="Tier name or id")
@click.option("--recall", "recall", type=float, default=None,
              help="Target share of wrong answers escalated (e.g. 0.5)")
@click.option("--precision", "precision", type=float, default=None,
              help="Target share of escalated answers that are wrong (e.g. 0.7)")
@click.option("--traces", "traces_file", type=click.Path(exists=True, dir_okay=False),
              default=None, help="Labelled traces, JSON lines with margin (or margin_window) "
                                 "and correct, e.g. bench/margin.py --out; default the ledger")
@click.option("--days", default=30.0, show_default=True, help="Ledger window")
@click.option("--model", default=None, help="Only ledger rows this model served")
@click.option("--save/--dry-run", default=False, show_default=True,
              help="Store the fitted γ on the tier (published to the gateways)")
@click.option("--json", "as_json", is_flag=True, help="Print the whole fit as JSON")
def calibrate_gamma(tier_ref, recall, precision, traces_file, days, model, save, as_json):
    """Fit S04's margin threshold γ for a tier on labelled traces, for a target escalation
    recall or precision; print the curve and the γ (and save it with --save)."""
    from app.audit.service import SYSTEM
    from app.cascade.gamma import calibrate
    from app.errors import ServiceError
    if (recall is None) == (precision is None):
        raise click.UsageError("give one of --recall or --precision")
    kind, target = ("recall", recall) if recall is not None else ("precision", precision)
    traces = None
    if traces_file:
        with open(traces_file) as f:
            traces = [json.loads(line) for line in f if line.strip()]
    try:
        fit = calibrate(SYSTEM, tier_ref, kind, target, traces=traces, days=days, model=model,
                        save=save)
    except ServiceError as exc:
        detail = "; ".join(f"{k}: {', '.join(v)}" for k, v in (exc.errors or {}).items())
        raise click.ClickException(f"{exc.message}{f' ({detail})' if detail else ''}")
    if as_json:
        click.echo(json.dumps(fit, indent=2, default=str))
        return
    click.echo(f"tier {fit['tier']} (model {fit['model']}): {fit['n']} labelled traces, "
               f"{fit['wrong']} wrong, from {fit['source']}; γ in force: "
               f"{'policy margin_gamma' if fit['gamma_before'] is None else fit['gamma_before']}")
    click.echo("   gamma  escalated  recall  precision  kept-accuracy")
    for p in _sample(fit["curve"]):
        prec = "—" if p["precision"] is None else f"{p['precision']:.1%}"
        kept = "—" if p["kept_accuracy"] is None else f"{p['kept_accuracy']:.1%}"
        click.echo(f" {p['gamma']:7.4f}  {p['escalation_rate']:8.1%}  {p['recall']:6.1%}  "
                   f"{prec:>9}  {kept:>13}")
    if fit["gamma"] is None:
        raise click.ClickException(fit["reason"])
    pt = fit["point"]
    click.echo(f"γ = {fit['gamma']:.4f} for {kind} >= {target:.0%}: escalates "
               f"{pt['escalation_rate']:.1%}, recall {pt['recall']:.1%}, precision "
               f"{'—' if pt['precision'] is None else format(pt['precision'], '.1%')}"
               f"{'; saved on the tier' if fit['saved'] else ' (dry run: --save stores it)'}")


def _sample(curve: list[dict], n: int = 12) -> list[dict]:
    """At most ``n`` points of the curve, evenly spread (the ends kept)."""
    if len(curve) <= n:
        return curve
    step = (len(curve) - 1) / (n - 1)
    return [curve[round(i * step)] for i in range(n)]
