"""An adapter keeps the form it learned, end to end on CPU: frontier answers of a schema
workflow become traces, the real Celery worker trains a LoRA on SmolLM2 in the form S02
gives tier 1 (minified keys, the compact grammar: ``app.adapters.served_form``), the node
worker hot-loads it on a reference engine, and it serves the workflow's tier-1 requests.
Then the tenant turns minification off. The gateway still sends the adapter its learned
form, so every answer is the same as before and reaches the client with its own keys.

The replay's ablation found the failure this guards against: adapters trained on aliases,
then sent full keys, failed every invoice answer (bench/results/replay.txt, no_minify). For
contrast, the test also asks the engine directly in the client's form (full keys, what the
gateway sent before) and prints how many of those answers were right; that figure is not
asserted (it depends on how the adapter generalises).

Lowered for CPU (stated): distill_min_traces 30, small hyperparameters."""
from __future__ import annotations

import json
import random

import httpx
import pytest

from app.adapters import rollout, states
from app.extensions import db
from app.policies.models import Policy
from tests.e2e.flywheel import (drain_traces_until, engine_models, make_world, reload,
                                start_pool, stop_pool, train_candidate)
from tests.factories import UserFactory
from tests.gateway.conftest import publish_and_wait
from tests.pools.conftest import free_port_run

WORKFLOW = "order-fields"
SYSTEM = "Extract the order's fields as JSON."
SCHEMA = {"type": "object", "additionalProperties": False,
          "properties": {"order_reference_code": {"type": "string"},
                         "quantity_ordered": {"type": "integer"},
                         "colour_of_the_item": {"type": "string"},
                         "customer_given_name": {"type": "string"}},
          "required": ["order_reference_code", "quantity_ordered", "colour_of_the_item",
                       "customer_given_name"]}
FORMAT = {"type": "json_schema", "json_schema": {"name": "order", "schema": SCHEMA}}
COLOURS = ["blue", "red", "green", "black", "white", "yellow", "silver"]
NAMES = ["Alice", "Bob", "Carol", "Dmitri", "Erin", "Farah", "Gustavo", "Hana", "Ivan", "Julia"]
HYPERPARAMS = {"rank": 8, "alpha": 16, "lr": 2e-3, "epochs": 2, "batch_size": 4}
N_TRACES, N_ASKED = 40, 8


def orders(n: int, seed: int) -> list[tuple[str, dict]]:
    """(user message, the fields it names); the fake frontier answers the words in order
    (``[[json:2]]``), so the answer is those fields."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        fields = {"order_reference_code": f"{rng.choice('ABCDEFGH')}{rng.randint(100, 999)}",
                  "quantity_ordered": rng.randint(2, 20),
                  "colour_of_the_item": rng.choice(COLOURS),
                  "customer_given_name": rng.choice(NAMES)}
        out.append((" ".join(str(v) for v in fields.values()), fields))
    return out


def ask(world, text: str, model: str, directive: str = "") -> httpx.Response:
    r = httpx.post(world.base_url + "/chat/completions", timeout=180,
                   headers={"authorization": f"Bearer {world.key}",
                            "x-sluice-workflow": WORKFLOW},
                   json={"model": model, "max_tokens": 64, "temperature": 0,
                         "response_format": FORMAT,
                         "messages": [{"role": "system", "content": SYSTEM},
                                      {"role": "user", "content": text + directive}]})
    assert r.status_code == 200, r.text
    return r


def answer(r: httpx.Response) -> dict | None:
    try:
        return json.loads(r.json()["choices"][0]["message"]["content"])
    except (TypeError, ValueError, KeyError):
        return None


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_adapter_keeps_its_learned_form_after_minify_is_turned_off(
        app, gateway, frontier, celery_worker, node_worker, own_files):
    ops = UserFactory(role="ops")
    world = make_world(app, gateway, frontier, free_port_run(1))
    pool = world.pool
    try:
        rep = start_pool(ops, pool, node_worker)
        for text, fields in orders(N_TRACES, seed=11):
            assert answer(ask(world, text, "tier-3", " [[json:2]]")) == fields
        assert drain_traces_until(world.tenant.id, N_TRACES, workflow=WORKFLOW) == N_TRACES

        adapter, done = train_candidate(ops, world.tenant.id, WORKFLOW, celery_worker,
                                        own_files, HYPERPARAMS)
        assert adapter.form["minify_enabled"] is True      # the policy's, as it froze
        rollout.shadow(ops, adapter.id, "load it")
        node_worker.wait_for(lambda: reload(adapter.id).loaded == {str(rep.id): "ok"}, 120,
                             "the adapter to load")
        assert done.name in engine_models(rep.url)
        served = reload(adapter.id)
        served.state, served.canary_pct = states.PROMOTED, 100
        db.session.commit()
        publish_and_wait(world.gateway)

        asked = orders(N_ASKED, seed=12)
        before = [ask(world, text, "tier-1") for text, _ in asked]
        assert all(r.headers["x-sluice-tier"] == "tier-1" for r in before)
        right = sum(answer(r) == fields for r, (_, fields) in zip(before, asked))

        # the tenant turns minification off: the adapter still gets the form it learned
        pol = db.session.scalar(db.select(Policy).where(Policy.tenant_id == world.tenant.id))
        pol.values = {**pol.values, "minify_enabled": False}
        db.session.commit()
        publish_and_wait(world.gateway)
        after = [ask(world, text, "tier-1") for text, _ in asked]
        assert [answer(r) for r in after] == [answer(r) for r in before]
        assert all(set(answer(r) or {}) == set(SCHEMA["properties"]) for r in after)
        assert right >= N_ASKED // 2, [answer(r) for r in before]

        # contrast: the client's form straight to the engine (what the gateway sent before)
        direct = [httpx.post(rep.url + "/v1/chat/completions", timeout=180, json={
            "model": done.name, "max_tokens": 64, "temperature": 0, "response_format": FORMAT,
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": text}]}) for text, _ in asked]
        right_direct = sum(answer(r) == fields for r, (_, fields) in zip(direct, asked))
        print(f"\nserved form: adapter trained on minified keys, {N_ASKED} held-out orders: "
              f"right {right}/{N_ASKED} in its learned form (minify on), the same answers "
              f"after minify was turned off; {right_direct}/{N_ASKED} when sent full keys")
    finally:
        stop_pool(ops, pool, node_worker)
