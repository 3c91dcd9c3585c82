"""``flask --app wsgi sluice ...`` commands."""
from __future__ import annotations

import os
import sys
from decimal import Decimal

import click
from flask.cli import AppGroup

from app.extensions import db

sluice_cli = AppGroup("sluice", help="Sluice administration")

# The seed's three tiers: blended $0.06 / $0.35 / $3.50 per 1M tokens.
SEED_TIERS = [
    {"name": "tier-1", "rank": 1, "model": "smollm2-135m-instruct (distilled specialist)",
     "price": Decimal("0.06"), "pool": "tier1-small"},
    {"name": "tier-2", "rank": 2, "model": "smollm2-135m-instruct (quantized large stand-in)",
     "price": Decimal("0.35"), "pool": "tier2-large"},
    {"name": "tier-3", "rank": 3, "model": "frontier", "price": Decimal("3.50"), "pool": None},
]


def seed_catalog(*, pool_port: int = 8510, frontier_url: str = "http://127.0.0.1:8530/v1",
                 node: str = "local") -> list[str]:
    """Create the default pools (engines on ``pool_port`` and ``pool_port + 10``) and three
    tiers (tier 3 at ``frontier_url``) if no tiers exist. Returns what was made."""
    from app.audit.service import SYSTEM, record
    from app.catalog.models import Pool, Tier
    from app.catalog.service import sync_replica_rows
    from app.policies.models import Policy
    from workers.pools.vllm_cmd import KV_EVENTS_BASE

    made: list[str] = []
    if db.session.scalar(db.select(Tier).limit(1)) is not None:
        return made
    pools = {}
    for i, (name, port) in enumerate((("tier1-small", pool_port),
                                      ("tier2-large", pool_port + 10))):
        # the engines publish their KV-cache events (vLLM's --kv-events-config), so the
        # node's subscriber keeps the block index and a tenant on replica_choice kv_events
        # routes on it: a PUB and a replay port per replica, 10 apart between the pools
        pool = Pool(name=name, node=node, engine="reference", model="smollm2",
                    served_model_name=name, desired_replicas=1, base_port=port,
                    gpu_type="L40S" if i == 0 else "H100",
                    options={"kv_events": {"port": KV_EVENTS_BASE + 10 * i}})
        db.session.add(pool)
        db.session.flush()
        sync_replica_rows(pool)
        record(SYSTEM, "pool.create", "pool", pool.id, after=pool.to_dict())
        pools[name] = pool
        made.append(f"pool {name}")
    for t in SEED_TIERS:
        # The seed gives one per-token cost per tier; input and output are priced at it
        # (so the 3:1 blend shown in the console is the seed's number), cached input at 1/4.
        # For the pool tiers this is only the real-time estimate budgets count: once a GPU
        # rate exists for the pool's gpu_type, FinOps charges the pool's GPU-hours instead
        # of it (app.finops.rollups, never both).
        price = t["price"]
        tier = Tier(name=t["name"], rank=t["rank"], model=t["model"],
                    price_input_per_m=price, price_cached_input_per_m=price / 4,
                    price_output_per_m=price,
                    upstream_kind="pool" if t["pool"] else "external",
                    pool_id=pools[t["pool"]].id if t["pool"] else None,
                    endpoint_url="" if t["pool"] else frontier_url,
                    api_key_env="" if t["pool"] else "SLUICE_PROVIDER_KEY_FRONTIER")
        db.session.add(tier)
        db.session.flush()
        record(SYSTEM, "tier.create", "tier", tier.id, after=tier.to_dict())
        made.append(f"tier {t['name']}")
    if db.session.scalar(db.select(Policy).where(Policy.tenant_id.is_(None))) is None:
        db.session.add(Policy(tenant_id=None, values={}))
        record(SYSTEM, "policy.create", "policy", "global", after={"values": {}})
    return made


@sluice_cli.command("init")
@click.option("--email", default=None, help="Admin email (else $SLUICE_ADMIN_EMAIL or a prompt)")
@click.option("--pool-port", type=int, default=8510, show_default=True,
              help="First seeded pool's engine port (the second pool's is 10 above)")
@click.option("--frontier-url", default="http://127.0.0.1:8530/v1", show_default=True,
              help="Seeded tier 3's OpenAI-compatible endpoint")
def init_command(email: str | None, pool_port: int, frontier_url: str) -> None:
    """Create the first admin and seed the default three-tier catalog."""
    from app.auth.models import User
    from app.auth.service import create_user
    from app.errors import ServiceError
    from app.snapshot.service import publish_after_commit

    made = seed_catalog(pool_port=pool_port, frontier_url=frontier_url,
                        node=os.environ.get("SLUICE_NODE") or "local")
    db.session.commit()
    for m in made:
        click.echo(f"created {m}")
    if db.session.scalar(db.select(User).where(User.role == "admin").limit(1)) is not None:
        click.echo("an admin already exists; nothing else to do")
        publish_after_commit()
        return
    email = email or os.environ.get("SLUICE_ADMIN_EMAIL") or click.prompt("Admin email")
    password = os.environ.get("SLUICE_ADMIN_PASSWORD")
    interactive = password is None
    while True:
        if password is None:
            password = click.prompt("Admin password", hide_input=True,
                                    confirmation_prompt=True)
        try:
            create_user(None, {"email": email, "password": password, "role": "admin"},
                        bootstrap=True)
            break
        except ServiceError as exc:
            for field, problems in exc.errors.items():
                click.echo(f"{field}: {'; '.join(problems)}", err=True)
            db.session.rollback()
            if not interactive or "password" not in exc.errors:
                sys.exit(2)
            password = None
    publish_after_commit()
    click.echo(f"admin {email} created; sign in at /login")


@sluice_cli.command("start-pools")
def start_pools_command() -> None:
    """Queue a start of every pool's wanted replicas on its node's worker queue."""
    from app.audit.service import SYSTEM
    from app.catalog.models import Pool
    from app.pools.service import request_pool_action

    for pool in db.session.scalars(db.select(Pool).order_by(Pool.id)):
        started = request_pool_action(SYSTEM, pool.id, "start")
        click.echo(f"pool {pool.name}: start queued for {len(started)} replica(s) "
                   f"on pool.{pool.node}")


@sluice_cli.command("stop-engines")
@click.option("--node", default=None, help="Node name (default: $SLUICE_NODE or local)")
def stop_engines_command(node: str | None) -> None:
    """Stop every engine process this node started, directly (not through the worker's
    queue: ``run.sh`` calls it on exit, after stopping the worker, so nothing restarts
    them and no engine outlives the system that started it; and at its start, so an
    engine a run killed with ``kill -9`` left behind is reaped). An engine is found by the
    pid and start time its pid file recorded, never by name."""
    import os

    from app.catalog.models import Pool, Replica
    from workers.pools import driver
    node = node or os.environ.get("SLUICE_NODE", "local")
    stopped = 0
    for replica in db.session.scalars(db.select(Replica).join(Pool).where(
            Pool.node == node).order_by(Replica.id)):
        if replica.pid or replica.state not in ("stopped", "down") \
                or driver.recorded_pid(replica):
            driver.stop_replica(replica.id)
            stopped += 1
    click.echo(f"node {node}: {stopped} engine replica(s) stopped")


@sluice_cli.command("unlock")
@click.argument("ident")
@click.option("--address", is_flag=True, help="IDENT is a client address, not an email")
def unlock_command(ident: str, address: bool) -> None:
    """Lift a sign-in lock (too many failed sign-ins) of an account or a client address."""
    from app.audit.service import SYSTEM
    from app.auth import throttle
    kind = "addr" if address else "account"
    had = throttle.lift(SYSTEM, kind, ident if address else ident.strip().lower())
    click.echo(f"{kind} {ident}: " + ("lock lifted" if had else "was not locked"))

