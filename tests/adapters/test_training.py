"""Training adapters: the request's rules, frozen datasets, and the ``adapters.train``
task through the real Celery worker: a LoRA on SmolLM2 that learns a templated
extraction workflow the base model gets wrong, and the task's failure, cancellation and
redelivery paths (on a tiny random Llama, for speed)."""
from __future__ import annotations

import hashlib
import json
import random
import shutil
from decimal import Decimal
from pathlib import Path

import pytest

from app.adapters import states, training
from app.adapters.datasets import freeze_dataset, read_dataset
from app.adapters.models import Adapter, AdapterEvent, AdapterTrace, TrainingDataset
from app.catalog.models import Pool, Tier
from app.errors import Conflict, Forbidden, NotFound, ValidationError
from app.extensions import db
from app.ledger.models import LedgerEntry
from app.policies.models import Policy
from tests.factories import TenantFactory, UserFactory

WORKFLOW = hashlib.sha256(b"orders-extract").hexdigest()
SYSTEM = "Extract the order as JSON with keys order_id, qty, item, customer."
JSON_MODE = {"type": "json_object"}
COLORS = ["blue", "red", "green", "black", "white", "yellow", "silver"]
ITEMS = ["widget", "gadget", "bolt", "valve", "bracket", "sprocket", "hinge"]
NAMES = ["Alice", "Bob", "Carol", "Dmitri", "Erin", "Farah", "Gustavo", "Hana", "Ivan", "Julia"]
N_TRACES = 48   # request ids req_order_000..047 hash to 39 train and 9 held out
SMALL = {"rank": 8, "alpha": 16, "lr": 1e-3, "epochs": 2, "batch_size": 4}


def order_trace(i: int, rng: random.Random, tenant_id: int, workflow: str = WORKFLOW
                ) -> AdapterTrace:
    oid = f"{rng.choice('ABCDEFGH')}{rng.randint(100, 999)}"
    qty, item = rng.randint(1, 20), f"{rng.choice(COLORS)} {rng.choice(ITEMS)}"
    customer = rng.choice(NAMES)
    answer = json.dumps({"order_id": oid, "qty": qty, "item": item, "customer": customer},
                        separators=(",", ":"))
    return AdapterTrace(request_id=f"req_order_{i:03d}", tenant_id=tenant_id, workflow=workflow,
                        tier="tier-3", response_format=JSON_MODE, answer=answer,
                        messages=[{"role": "system", "content": SYSTEM},
                                  {"role": "user",
                                   "content": f"Order #{oid}: {qty} x {item} for {customer}"}])


@pytest.fixture()
def adapters_dir(app):
    """The test's ADAPTERS_DIR; what a test adds to it is removed afterwards."""
    root = Path(app.config["ADAPTERS_DIR"])
    for sub in ("datasets", "artifacts", "tmp"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    before = {p for sub in ("datasets", "artifacts", "tmp") for p in (root / sub).iterdir()}
    yield root
    for sub in ("datasets", "artifacts", "tmp"):
        for p in (root / sub).iterdir():
            if p not in before:
                shutil.rmtree(p) if p.is_dir() else p.unlink()


def artifacts(root: Path) -> set[str]:
    return {p.name for p in (root / "artifacts").iterdir()}


def make_setup(model: str, n_traces: int = N_TRACES, min_traces: int = 20):
    """A tenant with ``n_traces`` order traces, its policy's distill_min_traces, a tier-1
    pool serving ``model`` and a frontier tier; returns (tenant, ops user, pool)."""
    tenant = TenantFactory()
    pool = Pool(name=f"t1-{tenant.id}", model=model, served_model_name="t1", engine="reference",
                options={})
    db.session.add(pool)
    db.session.flush()
    db.session.add_all([
        Tier(name=f"tier-1-{tenant.id}", rank=1, model=model, upstream_kind="pool",
             pool_id=pool.id, price_input_per_m=Decimal("0.06"),
             price_cached_input_per_m=Decimal("0.015"), price_output_per_m=Decimal("0.06")),
        Tier(name=f"tier-3-{tenant.id}", rank=3, model="frontier", upstream_kind="external",
             endpoint_url="http://127.0.0.1:9/v1", price_input_per_m=Decimal("3.5"),
             price_cached_input_per_m=Decimal("0.875"), price_output_per_m=Decimal("3.5")),
        Policy(tenant_id=tenant.id, values={"distill_min_traces": min_traces})])
    rng = random.Random(7)
    db.session.add_all([order_trace(i, rng, tenant.id) for i in range(n_traces)])
    db.session.commit()
    return tenant, UserFactory(role="ops"), pool


@pytest.fixture()
def no_enqueue(app, monkeypatch):
    """Requests whose task the test runs itself (nothing reaches the worker's queue)."""
    sent = []
    monkeypatch.setattr(app.extensions["celery"], "send_task",
                        lambda name, args=None, **kw: sent.append((name, args, kw)))
    return sent


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    from app.engine.model import build_tiny_llama
    return str(build_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama"))


def reload(adapter_id: int) -> Adapter:
    db.session.expire_all()
    return db.session.get(Adapter, adapter_id)


def test_request_training_rules(app, adapters_dir, no_enqueue, tiny_model):
    tenant, ops, pool = make_setup(tiny_model, n_traces=30, min_traces=31)
    with pytest.raises(ValidationError, match="30 usable traces of this workflow, 31 needed"):
        training.request_training(ops, tenant.id, WORKFLOW)
    viewer = UserFactory(role="viewer")
    with pytest.raises(Forbidden):
        training.request_training(viewer, tenant.id, WORKFLOW)
    other_tenant_ops = UserFactory(role="ops", tenant=TenantFactory())
    with pytest.raises(Forbidden):
        training.request_training(other_tenant_ops, tenant.id, WORKFLOW)
    db.session.get(Policy, db.session.scalar(db.select(Policy.id).where(
        Policy.tenant_id == tenant.id))).values = {"distill_min_traces": 30}
    db.session.commit()
    with pytest.raises(ValidationError) as bad:
        training.request_training(ops, tenant.id, WORKFLOW, hyperparams={"rank": 0, "lr2": 1})
    assert set(bad.value.errors) == {"rank", "lr2"}

    adapter = training.request_training(ops, tenant.id, WORKFLOW, hyperparams={"rank": 8})
    assert adapter.state == states.TRAINING and adapter.pool_id == pool.id
    assert adapter.name == f"wf-{WORKFLOW[:8]}-{adapter.id}" and adapter.base_model == tiny_model
    assert adapter.requested_by == ops.email and adapter.requested_by_id == ops.id
    # the served form its dataset froze in, kept for serving (app.adapters.served_form)
    from app.contract.policy import FORM_FIELDS
    from app.policies.service import effective_policy
    assert adapter.form == {f: effective_policy(tenant.id)[f] for f in FORM_FIELDS}
    assert adapter.events[0].data["form"] == adapter.form
    assert adapter.hyperparams["rank"] == 8 and adapter.hyperparams["alpha"] == 64
    assert adapter.progress["steps"] == training.planned_steps(adapter.dataset.n_train,
                                                               adapter.hyperparams)
    assert no_enqueue == [("adapters.train", [adapter.id], {"queue": "default"})]
    assert [e.event for e in adapter.events] == ["request"]
    with pytest.raises(Conflict, match="training"):
        training.request_training(ops, tenant.id, WORKFLOW)
    with pytest.raises(Forbidden):
        training.cancel_training(viewer, adapter.id)
    training.cancel_training(ops, adapter.id, "wrong workflow")
    assert reload(adapter.id).state == states.CANCELLED
    # cancelled is not in flight: a new request is accepted, on the same frozen dataset
    again = training.request_training(ops, tenant.id, WORKFLOW)
    assert again.dataset_id == adapter.dataset_id and again.name != adapter.name


def test_frozen_dataset_is_content_addressed_split_by_request_and_skips_failed(
        app, adapters_dir, tiny_model):
    tenant, _, _ = make_setup(tiny_model, n_traces=N_TRACES)
    db.session.add(LedgerEntry(request_id="req_order_000", tenant_id=tenant.id,
                               workflow=WORKFLOW, kind="request",
                               payload={"feedback": {"pass": False, "note": "bad qty"}}))
    db.session.commit()
    ds = freeze_dataset(tenant.id, WORKFLOW, min_traces=10, created_by="t@example.com")
    db.session.commit()
    path = Path(ds.path)
    assert path.name == f"{ds.sha256}.jsonl" and path.parent == adapters_dir / "datasets"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == ds.sha256
    train, heldout = read_dataset(ds)
    ids = [r["request_id"] for r in train + heldout]
    assert "req_order_000" not in ids and len(ids) == N_TRACES - 1   # its verdict was fail
    assert (ds.n_train, ds.n_heldout) == (len(train), len(heldout)) == (39, 8)
    assert all(r["split"] == "heldout" for r in heldout)
    # frozen again: the same file and row, the file untouched
    mtime = path.stat().st_mtime_ns
    assert freeze_dataset(tenant.id, WORKFLOW, min_traces=10).id == ds.id
    assert path.stat().st_mtime_ns == mtime
    assert db.session.scalar(db.select(db.func.count()).select_from(TrainingDataset)) == 1
    # one more trace: a new dataset, where every earlier trace kept its side
    db.session.add(order_trace(999, random.Random(1), tenant.id))
    db.session.commit()
    bigger = freeze_dataset(tenant.id, WORKFLOW, min_traces=10)
    assert bigger.sha256 != ds.sha256
    train2, heldout2 = read_dataset(bigger)
    assert {r["request_id"] for r in heldout} <= {r["request_id"] for r in heldout2}
    path.write_bytes(path.read_bytes() + b"\n{}")
    with pytest.raises(ValidationError, match="changed since it was frozen"):
        read_dataset(ds)
    path.unlink()
    with pytest.raises(NotFound):
        read_dataset(ds)


@pytest.mark.slow
@pytest.mark.timeout(900)   # its own wait below is 600 s; the global 300 s would cut it first
def test_adapter_learns_the_extraction_workflow(app, adapters_dir, celery_worker):
    """Trains on SmolLM2 through the worker: the base model answers the held-out orders
    with malformed JSON, the adapter with the frontier's exact fields."""
    tenant, ops, _ = make_setup("smollm2")
    adapter = training.request_training(ops, tenant.id, WORKFLOW, hyperparams=SMALL)
    done = celery_worker.wait_for(
        lambda: (a := reload(adapter.id)).state != states.TRAINING and a, timeout_s=600,
        what="training to finish")
    assert done.state == states.CANDIDATE, (done.error, celery_worker.log()[-3000:])
    off = done.offline
    assert off["metric"] == "json_fields" and off["n"] == 9
    assert off["concordance"] >= off["base_concordance"] + 0.3, off
    assert off["ci_low"] <= off["concordance"] <= off["ci_high"]
    assert off["tokens"] > 0 and off["latency_ms"] > 0 and len(off["samples"]) == 5
    assert done.progress["step"] == done.progress["steps"] == 20
    assert len(done.progress["history"]) == 20 and done.progress["phase"] == "done"
    art = Path(done.artifact_path)
    assert art.parent == adapters_dir / "artifacts" and art.name == done.sha256
    assert training.artifact_sha256(art) == done.sha256
    assert (art / "adapter_config.json").exists()
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["base_model"] == "smollm2" and manifest["sha256"] == done.sha256
    assert manifest["dataset_sha256"] == done.dataset.sha256
    assert manifest["hyperparams"]["rank"] == 8 and manifest["metrics"]["steps"] == 20
    assert done.manifest["sha256"] == done.sha256
    assert [e.event for e in done.events] == ["request", "trained"]
    assert not list((adapters_dir / "tmp").iterdir())


def test_missing_dataset_fails_the_adapter_and_stores_nothing(
        app, adapters_dir, celery_worker, no_enqueue, tiny_model):
    tenant, ops, _ = make_setup(tiny_model)
    adapter = training.request_training(ops, tenant.id, WORKFLOW, hyperparams=SMALL)
    Path(adapter.dataset.path).unlink()
    before = artifacts(adapters_dir)
    celery = app.extensions["celery"]
    type(celery).send_task(celery, "adapters.train", args=[adapter.id], queue="default")
    done = celery_worker.wait_for(
        lambda: (a := reload(adapter.id)).state != states.TRAINING and a, timeout_s=120,
        what="the task to fail")
    assert done.state == states.FAILED
    assert "NotFound" in done.error and "missing" in done.error
    assert done.sha256 is None and done.artifact_path is None
    assert artifacts(adapters_dir) == before and not list((adapters_dir / "tmp").iterdir())
    assert [e.event for e in done.events] == ["request", "fail"]


def test_cancel_during_training_stops_without_an_artifact(
        app, adapters_dir, celery_worker, tiny_model):
    tenant, ops, _ = make_setup(tiny_model)
    before = artifacts(adapters_dir)
    adapter = training.request_training(ops, tenant.id, WORKFLOW,
                                        hyperparams={**SMALL, "epochs": 1000, "batch_size": 1})
    celery_worker.wait_for(lambda: reload(adapter.id).progress.get("step", 0) >= 2,
                           timeout_s=120, what="training to start")
    training.cancel_training(ops, adapter.id, "not needed")
    done = celery_worker.wait_for(
        lambda: (a := reload(adapter.id)).progress.get("phase") == "cancelled" and a,
        timeout_s=120, what="the task to stop")
    assert done.state == states.CANCELLED and done.progress["step"] < done.progress["steps"]
    assert done.sha256 is None and done.artifact_path is None
    assert artifacts(adapters_dir) == before and not list((adapters_dir / "tmp").iterdir())
    assert [e.event for e in done.events] == ["request", "cancel"]


def test_redelivered_task_neither_trains_twice_nor_overwrites(
        app, adapters_dir, no_enqueue, tiny_model, monkeypatch):
    tenant, ops, _ = make_setup(tiny_model)
    adapter = training.request_training(ops, tenant.id, WORKFLOW, hyperparams=SMALL)

    class Killed(BaseException):
        """The worker died after storing the artifact, before finishing."""

    def killed(*a, **kw):
        raise Killed()

    monkeypatch.setattr(training, "evaluate_offline", killed)
    with pytest.raises(Killed):
        training.train_adapter(adapter.id)
    db.session.rollback()
    stored = reload(adapter.id)
    assert stored.state == states.TRAINING and stored.artifact_path
    art, sha = Path(stored.artifact_path), stored.sha256
    mtimes = {p.name: p.stat().st_mtime_ns for p in art.iterdir()}
    monkeypatch.undo()

    def trained_twice(*a, **kw):
        raise AssertionError("trained twice")

    monkeypatch.setattr(training, "fit_lora", trained_twice)
    assert training.train_adapter(adapter.id)["state"] == states.CANDIDATE
    done = reload(adapter.id)
    assert done.sha256 == sha and done.offline["n"] == 9
    assert done.offline["cost_per_1k_before"] and done.offline["cost_per_1k_after"]
    # delivered once more: nothing to do
    assert training.train_adapter(adapter.id) == {"adapter_id": adapter.id,
                                                  "skipped": states.CANDIDATE}
    assert {p.name: p.stat().st_mtime_ns for p in art.iterdir()} == mtimes
    assert [e.event for e in done.events] == ["request", "trained"]
    assert db.session.scalar(db.select(db.func.count()).select_from(AdapterEvent)) == 2


def test_cost_per_1k_before_comes_from_the_ledger_and_after_from_the_adapters_tier(
        app, tiny_model):
    from datetime import datetime, timedelta, timezone
    tenant, _, pool = make_setup(tiny_model, n_traces=0)
    adapter = Adapter(tenant_id=tenant.id, workflow=WORKFLOW, name="lora-cost", pool_id=pool.id,
                      state=states.CANDIDATE)
    db.session.add(adapter)
    db.session.commit()
    offline = {"prompt_tokens": 1000.4, "reference_tokens": 200, "tokens": 180.2}
    # no traffic yet: all-frontier at the held-out tokens (1000 x 3.5 + 200 x 3.5) / 1e6 x 1000
    cost = training.cost_per_1k(adapter, offline)
    assert cost["cost_per_1k_before"] == "4.200000"
    assert "no ledger rows" in cost["cost_before_source"]
    # tier 1 at the prompt and the adapter's own tokens: (1000 + 180) x 0.06 / 1e6 x 1000
    assert cost["cost_per_1k_after"] == "0.070800"
    # with traffic: what the workflow's requests cost (a cache hit at 0 counts), old rows not
    now = datetime.now(timezone.utc)
    db.session.add_all([LedgerEntry(request_id=f"req_cost_{i}", tenant_id=tenant.id,
                                    workflow=WORKFLOW, tier="tier-3", cost_usd=Decimal(c), at=at)
                        for i, (c, at) in enumerate([("0.00123", now), ("0.000011", now),
                                                     ("0", now),
                                                     ("9", now - timedelta(days=30))])])
    db.session.commit()
    cost = training.cost_per_1k(adapter, offline)
    assert cost["cost_per_1k_before"] == "0.413667"   # (0.00123 + 0.000011) / 3 x 1000
    assert cost["cost_before_source"].startswith("ledger: 3 requests")


def test_offline_budget_never_exceeds_the_requests_own_max_tokens():
    """The offline evaluation cuts an answer where the live path would: at the request's
    max_tokens, below twice the reference plus 16 and the cap."""
    from app.adapters.evaluation import sample_budget as budget

    class Words:     # a tokenizer of whitespace words
        def encode(self, text, add_special_tokens=False):
            return text.split()
    ref = {"answer": " ".join(["w"] * 30)}
    assert budget(Words(), ref, 256) == 76                          # 2 * 30 + 16
    assert budget(Words(), ref, 50) == 50                           # the cap
    assert budget(Words(), {**ref, "max_tokens": 40}, 256) == 40    # the request's own
    assert budget(Words(), {**ref, "max_tokens": 500}, 256) == 76


def test_frozen_records_carry_the_traces_max_tokens(app, adapters_dir, tiny_model):
    tenant, _, _ = make_setup(tiny_model, n_traces=12)
    traces = list(db.session.scalars(db.select(AdapterTrace).where(
        AdapterTrace.tenant_id == tenant.id)))
    traces[0].max_tokens = 64
    db.session.commit()
    ds = freeze_dataset(tenant.id, WORKFLOW, min_traces=10)
    db.session.commit()
    train, heldout = read_dataset(ds)
    got = {r["request_id"]: r.get("max_tokens") for r in train + heldout}
    assert got[traces[0].request_id] == 64
    assert sum(v is None for v in got.values()) == len(got) - 1
