"""Helpers for the LoRA flywheel end-to-end test (tests/e2e/test_flywheel_browser.py).

The workflow (synthetic, stated): an order desk. The system prompt says "Confirm each
order."; the user sends "Order #A123: 3 x blue widget for Alice" (random ids, quantities,
colours, items, customers); the fake frontier (tests/gateway/fake_upstream.py) answers
"Echo: <first 12 words of the last user message>", i.e. "Echo: Order #A123: 3 x blue
widget for Alice". Base SmolLM2-135M answers with a chatty confirmation (or a fragment of
the order); an 8-step LoRA learns the echo exactly (scratch run on 2 shared cores: base
0-20% vs adapter 100% held-out concordance).
"""
from __future__ import annotations

import json
import random
import time
from decimal import Decimal
from pathlib import Path

import httpx

from tests.gateway.conftest import World, health

WORKFLOW = "orders-echo"        # X-Sluice-Workflow (a valid header value is its signature)
NODE = "flywheel"               # this test's own node queue: pool.flywheel
SYSTEM = "You are the order desk. Confirm each order."
COLORS = ["blue", "red", "green", "black", "white", "yellow", "silver"]
ITEMS = ["widget", "gadget", "bolt", "valve", "bracket", "sprocket", "hinge"]
NAMES = ["Alice", "Bob", "Carol", "Dmitri", "Erin", "Farah", "Gustavo", "Hana", "Ivan", "Julia"]
# Small on purpose (the seed's defaults are rank 32, lr 2e-4): ~32 train traces, 8 steps.
HYPERPARAMS = {"rank": 8, "alpha": 16, "lr": 2e-3, "epochs": 1, "batch_size": 4}
POOL_OPTIONS = {"lora": {"max_loras": 2}, "threads": 1, "max_prefix_tokens": 2048}
# Lowered for a CPU test (stated): the tenant's distill_min_traces (default 2500) and
# shadow_concordance (default 0.99), ADAPTERS_SHADOW_MIN_REQUESTS (default 200).
POLICY = {"cache_enabled": False, "margin_gamma": 0.0, "frontier_first_hours": 0,
          "distill_min_traces": 30, "shadow_concordance": 0.8}
SHADOW_MIN_REQUESTS = 5


def wait_for(pred, timeout: float, what: str, every: float = 0.2):
    """Poll ``pred`` until it returns something truthy (returned); fail after ``timeout``
    seconds naming ``what`` and the last value seen."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def orders(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"Order #{rng.choice('ABCDEFGH')}{rng.randint(100, 999)}: {rng.randint(1, 20)} x "
            f"{rng.choice(COLORS)} {rng.choice(ITEMS)} for {rng.choice(NAMES)}"
            for _ in range(n)]


def echo(order: str) -> str:
    """The frontier's answer to ``order`` (what the adapter should learn)."""
    return "Echo: " + " ".join(order.split()[:12])


def make_world(app, gateway, frontier, pool_port: int) -> World:
    """A tenant (policy ``POLICY``) whose tier 1 is a one-replica reference-engine pool of
    SmolLM2 with LoRA enabled on node ``NODE`` (not started yet) and whose tier 3 is the
    fake frontier; the snapshot is published and the gateway has it."""
    from app.catalog.models import Pool, Tier
    from app.catalog.service import sync_replica_rows
    from app.extensions import db
    from app.policies.models import Policy
    from tests.factories import TenantFactory, make_key
    from tests.gateway.conftest import publish_and_wait
    tenant = TenantFactory(name="order-desk")
    _, key = make_key(tenant)
    pool = Pool(name=f"flywheel-{tenant.id}", engine="reference", model="smollm2",
                served_model_name="smollm2-135m", desired_replicas=1, base_port=pool_port,
                node=NODE, options=POOL_OPTIONS)
    db.session.add(pool)
    db.session.flush()
    sync_replica_rows(pool)
    tiers = {
        1: Tier(name="tier-1", rank=1, model="smollm2-135m", upstream_kind="pool",
                pool_id=pool.id, price_input_per_m=Decimal("0.06"),
                price_cached_input_per_m=Decimal("0.015"), price_output_per_m=Decimal("0.18"),
                timeout_s=120),
        3: Tier(name="tier-3", rank=3, model="frontier-model", upstream_kind="external",
                endpoint_url=frontier.url + "/v1", api_key_env="SLUICE_PROVIDER_KEY_FRONTIER",
                price_input_per_m=Decimal("3.50"), price_cached_input_per_m=Decimal("0.875"),
                price_output_per_m=Decimal("10.50"), timeout_s=30)}
    db.session.add_all(tiers.values())
    db.session.add(Policy(tenant_id=None, values={}))
    db.session.add(Policy(tenant_id=tenant.id, values=POLICY))
    db.session.commit()
    written = health(gateway)["ledger_written"]
    publish_and_wait(gateway)
    return World(gateway=gateway, tenant=tenant, key=key, tiers=tiers, pool=pool,
                 written_before=written)


def replica(pool_id: int):
    from app.catalog.models import Replica
    from app.extensions import db
    db.session.expire_all()
    return db.session.scalar(db.select(Replica).where(Replica.pool_id == pool_id))


def start_pool(ops, pool, worker, timeout: float = 300):
    """Start the pool from the pool service (the node worker spawns the engine, waits for
    /health and marks the replica healthy); returns the healthy replica. A start that
    outlived the task's own wait is finished by a supervisor pass, as beat would."""
    from app.pools.service import request_pool_action, send_to_node
    request_pool_action(ops, pool.id, "start")
    last_supervise = [time.monotonic()]

    def healthy():
        r = replica(pool.id)
        if r.state == "down":
            raise AssertionError(f"replica down: {r.last_error}\n{worker.log()[-3000:]}")
        if r.state == "starting" and time.monotonic() - last_supervise[0] > 10:
            send_to_node("pools.supervise", [NODE], NODE)
            last_supervise[0] = time.monotonic()
        return r if r.state == "healthy" else None
    return worker.wait_for(healthy, timeout, "the SmolLM2 replica to be healthy")


def stop_pool(ops, pool, worker) -> None:
    from app.pools.service import request_pool_action
    from workers.pools import launcher
    pid = replica(pool.id).pid
    try:
        request_pool_action(ops, pool.id, "stop")
        worker.wait_for(lambda: replica(pool.id).state == "stopped", 60, "the pool to stop")
    finally:
        launcher.terminate(pid, grace_s=5)


def chat(world: World, content: str, model: str, max_tokens: int = 32) -> httpx.Response:
    """One request of the workflow through the real gateway (greedy)."""
    r = httpx.post(world.base_url + "/chat/completions", timeout=180,
                   headers={"authorization": f"Bearer {world.key}",
                            "x-sluice-workflow": WORKFLOW},
                   json={"model": model, "max_tokens": max_tokens, "temperature": 0,
                         "messages": [{"role": "system", "content": SYSTEM},
                                      {"role": "user", "content": content}]})
    assert r.status_code == 200, r.text
    return r


def content_of(r: httpx.Response) -> str:
    return r.json()["choices"][0]["message"]["content"]


def ledger_rows(world: World, n_events: int, timeout: float = 180):
    """Once the gateway has written ``n_events`` ledger events since the world was made,
    drain the stream and return the tenant's ledger rows (oldest first)."""
    from app.extensions import db
    from app.ledger.models import LedgerEntry
    from app.ledger.service import drain_stream
    wait_for(lambda: health(world.gateway)["ledger_written"] >= world.written_before + n_events,
             timeout, f"{n_events} ledger events from the gateway", every=0.25)
    drain_stream(max_batches=50)
    db.session.expire_all()
    return list(db.session.scalars(db.select(LedgerEntry).where(
        LedgerEntry.tenant_id == world.tenant.id).order_by(LedgerEntry.id)))


def drain_traces_until(tenant_id: int, n: int, timeout: float = 60,
                       workflow: str = WORKFLOW) -> int:
    """Run the trace drain (what adapters.drain_traces runs every 5 s) until the
    workflow has ``n`` rows in adapter_traces."""
    from app.adapters.traces import count_usable, drain_traces

    def enough():
        drain_traces()
        return count_usable(tenant_id, workflow) >= n
    wait_for(enough, timeout, f"{n} traces in adapter_traces", every=0.3)
    return count_usable(tenant_id, workflow)


def train_candidate(ops, tenant_id: int, workflow: str, worker, files: list,
                    hyperparams: dict | None = None):
    """An ops user's training request for the workflow (``hyperparams``, default
    ``HYPERPARAMS``; a quarter held out
    by request-id hash), run by the Celery ``worker`` to a candidate; its dataset and
    artifact paths go to ``files`` (removed by the caller). Returns (the adapter as
    requested, the candidate)."""
    from app.adapters import states, training
    adapter = training.request_training(ops, tenant_id, workflow,
                                        hyperparams=hyperparams or HYPERPARAMS,
                                        heldout_fraction=0.25)
    files.append(Path(adapter.dataset.path))
    done = worker.wait_for(lambda: (a := reload(adapter.id)).state != states.TRAINING and a,
                           600, "training to finish")
    if done.artifact_path:
        files.append(Path(done.artifact_path))
    assert done.state == states.CANDIDATE, (done.error, worker.log()[-3000:])
    return adapter, done


def reload(adapter_id: int):
    from app.adapters.models import Adapter
    from app.extensions import db
    db.session.expire_all()
    return db.session.get(Adapter, adapter_id)


def snapshot_entry(tenant_id: int) -> dict | None:
    """The workflow's adapters entry in the published snapshot (Redis), as JSON."""
    from app.redis_client import get_redis, keys
    snap = json.loads(get_redis().get(keys().snapshot_data()) or "{}")
    return (snap.get("adapters") or {}).get(f"{tenant_id}:{WORKFLOW}")


def gateway_has_latest(gateway) -> bool:
    """The gateway has reloaded the latest published snapshot."""
    from app.redis_client import get_redis, keys
    version = int(get_redis().get(keys().snapshot_version()) or 0)
    return (health(gateway).get("snapshot_version") or 0) >= version


def wait_snapshot(world: World, pred, what: str, timeout: float = 60) -> dict | None:
    """Until the snapshot's entry satisfies ``pred`` and the gateway serves that snapshot."""
    seen: list = []

    def matches() -> bool:
        seen[:] = [snapshot_entry(world.tenant.id)]
        return bool(pred(seen[0]))
    wait_for(matches, timeout, what)
    wait_for(lambda: gateway_has_latest(world.gateway), 15, "the gateway to reload")
    return seen[0]


def engine_models(url: str) -> list[str]:
    return [m["id"] for m in httpx.get(url + "/v1/models", timeout=10).json()["data"]]
