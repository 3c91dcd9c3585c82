"""``flask --app wsgi drill domain-shift`` (CD-28B) and ``flask --app wsgi router ...`` (the
S01 cascade router; the command group keeps its name)."""
from __future__ import annotations

import json

import click
from flask.cli import AppGroup

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
def domain_shift(url, key, workflow, n_ood, n_control, max_tokens, timeout_s, ledger_wait,
                 min_escalation_rate):
    """CD-28B: inject complex out-of-domain prompts into a simple workflow; report the
    escalation rate, the added latency, and whether any aborted-tier byte reached the client."""
    from app.errors import ValidationError
    from app.cascade.drill_runs import record_domain_shift
    try:
        run = record_domain_shift(url, key, workflow=workflow, n_ood=n_ood,
                                  n_control=n_control, max_tokens=max_tokens,
                                  timeout_s=timeout_s, ledger_wait_s=ledger_wait,
                                  min_escalation_rate=min_escalation_rate)
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
