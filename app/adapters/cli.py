"""``flask --app wsgi adapters ...``: list adapters, request a training, and the rollout
steps (approve, reject, advance, promote, rollback) acting as a named console user, so
the role, the tenant scope and the four-eyes rule apply as they do in the console."""
from __future__ import annotations

import json

import click
from flask.cli import AppGroup

adapters_cli = AppGroup("adapters", help="LoRA adapters and their rollout")


def groups() -> list:
    return [adapters_cli]


def _acting_user(email: str):
    """The active console user with ``email``; a clear error when there is none."""
    from app.auth.models import User
    from app.extensions import db
    user = db.session.scalar(db.select(User).where(User.email == email.strip().lower()))
    if user is None or not user.active:
        raise click.ClickException(f"no active console user with email {email!r} "
                                   "(--as names the person the change is recorded for)")
    return user


def _run(fn):
    """``fn()``, with a service's refusal as a one-line error (exit code 1)."""
    from app.errors import ServiceError
    try:
        return fn()
    except ServiceError as exc:
        fields = "; ".join(f"{k}: {', '.join(v)}" for k, v in exc.errors.items())
        raise click.ClickException(exc.message + (f" ({fields})" if fields else "")) from None


def _fraction(value) -> str:
    return f"{value:.1%}" if isinstance(value, (int, float)) else "-"


@adapters_cli.command("list")
@click.option("--state", default=None, help="Only adapters in this state")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per adapter")
def list_command(state: str | None, as_json: bool) -> None:
    """Every adapter, newest first."""
    from app.adapters import service
    from app.adapters.views import parse_state
    state = _run(lambda: parse_state(state))
    adapters = service.list_adapters(service.SYSTEM,
                                     states_in=frozenset({state}) if state else None)
    if as_json:
        click.echo(json.dumps([a.to_dict() for a in adapters], indent=2, default=str))
        return
    for a in adapters:
        canary = f"{a.canary_pct}%" if a.state in ("canary", "promoted") else "-"
        click.echo(f"{a.id:>5}  tenant {a.tenant_id:<4} {a.name:<24} {a.state:<18} {canary:>5}  "
                   f"offline {_fraction((a.offline or {}).get('concordance')):>6}  "
                   f"{a.workflow_name or a.workflow}")
    if not adapters:
        click.echo("no adapters")


@adapters_cli.command("train")
@click.option("--tenant", "tenant_id", type=int, required=True, help="Tenant id")
@click.option("--workflow", required=True, help="Workflow signature (or its name)")
@click.option("--as", "email", required=True, help="Email of the console user requesting it")
@click.option("--hyperparams", default=None, help='JSON object, e.g. \'{"max_steps": 50}\'')
def train_command(tenant_id: int, workflow: str, email: str, hyperparams: str | None) -> None:
    """Freeze the workflow's traces and queue an adapter's training."""
    from app.adapters.views import train_workflow
    try:
        hp = json.loads(hyperparams) if hyperparams else None
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--hyperparams") from None
    if hp is not None and not isinstance(hp, dict):
        raise click.BadParameter("a JSON object", param_hint="--hyperparams")
    user = _acting_user(email)
    adapter = _run(lambda: train_workflow(user, tenant_id, workflow, hyperparams=hp))
    click.echo(f"adapter {adapter.id} ({adapter.name}) queued for training: "
               f"{adapter.progress.get('steps', '?')} steps")


def _rollout_command(event: str, doc: str) -> None:
    @adapters_cli.command(event, help=doc)
    @click.argument("adapter_id", type=int)
    @click.option("--comment", default="", help="Why (required to approve or reject)")
    @click.option("--as", "email", required=True, help="Email of the console user acting")
    def command(adapter_id: int, comment: str, email: str) -> None:
        from app.adapters.views import perform
        user = _acting_user(email)
        adapter = _run(lambda: perform(user, adapter_id, event, comment))
        if event == "retrain":
            click.echo(f"adapter {adapter_id} retired; adapter {adapter.id} ({adapter.name}) "
                       f"queued for training on the current traces: "
                       f"{adapter.progress.get('steps', '?')} steps")
            return
        pct = f" at {adapter.canary_pct}%" if adapter.state == "canary" else ""
        click.echo(f"adapter {adapter.id} ({adapter.name}) is now {adapter.state}{pct}")


for _event, _doc in (("approve", "Approve an adapter awaiting approval: canary at 5%."),
                     ("reject", "Reject an adapter awaiting approval."),
                     ("advance", "The next canary step (5 -> 25 -> promoted at 100)."),
                     ("promote", "Promote a canary adapter to all of its workflow's traffic."),
                     ("rollback", "Roll back a canary or promoted adapter (restores the "
                                  "one it replaced)."),
                     ("retrain", "Retire an adapter nobody serves (held back in shadow, "
                                 "rejected, rolled back, failed) and train a new one of its "
                                 "workflow on the usable traces there are now.")):
    _rollout_command(_event, _doc)
