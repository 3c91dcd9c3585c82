"""Training an adapter: the request (console, API) and the ``adapters.train`` task.

``request_training`` freezes the workflow's traces into a dataset, creates the adapter
in ``training`` on the tier-1 pool (the lowest-rank enabled tier served by a pool) and
queues the task on ``ADAPTERS_TRAIN_QUEUE``. ``train_adapter`` (the task) fits a PEFT
LoRA on the pool's base model (loss on the answer tokens only, the chat template the
engine serves), writing ``progress`` as it goes and stopping between steps when the
adapter was cancelled; then it stores the artifact, content-addressed, under
``ADAPTERS_DIR/artifacts/<sha256>/`` (with ``manifest.json``), evaluates it offline
(``app.adapters.evaluation``) and moves the adapter to ``candidate``.

Redelivery (acks late: a killed worker's task runs again): an adapter no longer in
training is left alone; one whose artifact was stored is evaluated and finished from
it; otherwise training starts again from scratch (a dead attempt's temp folder is
removed first). A failed or cancelled adapter keeps no artifact of its own.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import re
import resource
import shutil
import time
import uuid
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any, Callable

from flask import current_app

from app.adapters import service, states
from app.adapters.datasets import adapters_dir, freeze_dataset, read_dataset
from app.adapters.evaluation import chat_prompt, evaluate_offline, load_base
from app.adapters.models import Adapter, AdapterEvent
from app.audit.service import record
from app.errors import Conflict, Forbidden, NotFound, ServiceError, ValidationError
from app.extensions import db

log = logging.getLogger(__name__)

# The seed's LoRA settings; a request may override any of them (tests train smaller).
DEFAULT_HYPERPARAMS: dict[str, Any] = {
    "rank": 32, "alpha": 64, "lr": 2e-4, "epochs": 1, "batch_size": 4, "dropout": 0.0,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"], "max_seq_len": 1024,
    "max_steps": None, "seed": 0}
_LIMITS: dict[str, tuple[type, float, float]] = {
    "rank": (int, 1, 256), "alpha": (float, 0.1, 1024), "lr": (float, 1e-7, 1.0),
    "epochs": (int, 1, 1000), "batch_size": (int, 1, 512), "dropout": (float, 0.0, 0.9),
    "max_seq_len": (int, 16, 32768), "max_steps": (int, 1, 10_000_000), "seed": (int, 0, 2**31)}
MANIFEST = "manifest.json"
HISTORY_POINTS = 200


class _Cancelled(Exception):
    """The adapter left ``training`` (cancelled) while the task worked on it."""


def validate_hyperparams(given: dict[str, Any] | None) -> dict[str, Any]:
    """The defaults overridden by ``given``; ValidationError naming each bad field."""
    hp = dict(DEFAULT_HYPERPARAMS)
    errors: dict[str, list[str]] = {}
    for key, value in (given or {}).items():
        if key not in hp:
            errors[key] = ["unknown hyperparameter"]
        elif key == "target_modules":
            if not (isinstance(value, list) and value
                    and all(isinstance(v, str) and re.fullmatch(r"[\w.]+", v) for v in value)):
                errors[key] = ["a list of module names"]
            else:
                hp[key] = value
        elif value is None and key == "max_steps":
            hp[key] = None
        else:
            kind, low, high = _LIMITS[key]
            try:
                v = kind(value)
                if isinstance(value, bool) or not low <= v <= high or (kind is int and v != value):
                    raise ValueError
            except (TypeError, ValueError):
                errors[key] = [f"a {kind.__name__} from {low:g} to {high:g}"]
                continue
            hp[key] = v
    if errors:
        raise ValidationError("bad hyperparameters", errors)
    return hp


def planned_steps(n_train: int, hp: dict[str, Any]) -> int:
    steps = int(hp["epochs"]) * math.ceil(n_train / int(hp["batch_size"]))
    return min(steps, int(hp["max_steps"])) if hp.get("max_steps") else steps


def tier1_pool():
    """The pool of the lowest-rank enabled tier that a pool serves (ValidationError if none)."""
    from app.catalog.models import Pool, Tier
    tier = db.session.scalar(db.select(Tier).where(Tier.enabled.is_(True),
                                                   Tier.upstream_kind == "pool",
                                                   Tier.pool_id.is_not(None))
                             .order_by(Tier.rank).limit(1))
    pool = db.session.get(Pool, tier.pool_id) if tier is not None else None
    if pool is None:
        raise ValidationError("no tier served by a pool: an adapter needs a tier-1 pool")
    return pool


def _lora_name(workflow: str, adapter_id: int) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", workflow.lower()).strip("-")[:8] or "wf"
    return f"wf-{slug}-{adapter_id}"


def _new_adapter(user, tenant_id: int, workflow: str, hp: dict[str, Any], pool,
                 dataset, *, retrain_of: Adapter | None = None, comment: str = "",
                 form: dict[str, Any] | None = None) -> Adapter:
    """The adapter row in training, its "request" event and audit row (not committed).
    ``form``: the served form its dataset froze in (``policy.form_of``)."""
    from app.workflows.models import Workflow
    wf = db.session.scalar(db.select(Workflow).where(Workflow.tenant_id == tenant_id,
                                                     Workflow.signature == workflow))
    adapter = Adapter(tenant_id=tenant_id, workflow=workflow, workflow_name=wf.name if wf else "",
                      pool_id=pool.id, name=f"pending-{uuid.uuid4().hex[:16]}",
                      base_model=pool.model, state=states.TRAINING, requested_by_id=user.id,
                      form=dict(form or {}),
                      requested_by=user.email, dataset_id=dataset.id, hyperparams=hp,
                      progress={"step": 0, "steps": planned_steps(dataset.n_train, hp),
                                "phase": "queued"})
    db.session.add(adapter)
    db.session.flush()
    adapter.name = _lora_name(workflow, adapter.id)
    lineage = {} if retrain_of is None else {"retrain_of": retrain_of.id,
                                                "retrain_of_name": retrain_of.name}
    db.session.add(AdapterEvent(adapter_id=adapter.id, actor_email=user.email, event="request",
                                from_state="", to_state=states.TRAINING, comment=comment[:2000],
                                data={"dataset_sha256": dataset.sha256, "hyperparams": hp,
                                      "n_train": dataset.n_train,
                                      "n_heldout": dataset.n_heldout, "form": form or {},
                                      **lineage}))
    record(user, "adapter.request", "adapter", adapter.id, tenant_id=tenant_id,
           after={"name": adapter.name, "workflow": workflow, "pool_id": pool.id,
                  "dataset_sha256": dataset.sha256, "hyperparams": hp, **lineage})
    return adapter


def require_train(user, tenant_id: int) -> None:
    """Forbidden unless ``user`` may train adapters for the tenant."""
    if not user.can("adapter.train", tenant_id):
        raise Forbidden(f"your role ({user.role}) may not train adapters for this tenant")


def request_training(user, tenant_id: int, workflow: str, *,
                     hyperparams: dict[str, Any] | None = None,
                     heldout_fraction: float = 0.2, retrain_of: Adapter | None = None,
                     comment: str = "") -> Adapter:
    """Freeze the workflow's traces and queue an adapter's training (one commit).
    Forbidden without adapter.train on the tenant; Conflict while the workflow has an
    adapter in flight; ValidationError below the tenant's ``distill_min_traces``. A
    refusal rolls back (releasing the tenant row locked here). ``retrain_of``: an adapter
    of the workflow this one replaces (``retrain``), retired in the same commit unless it
    is already, and refused when the traces are still the ones it was trained on."""
    from app.adapters.served_form import served_form
    from app.contract.policy import form_of
    from app.policies.service import effective_policy
    from app.tenants.models import Tenant
    require_train(user, tenant_id)
    # Serializes requests of one tenant (the in-flight check below is then race-free).
    if db.session.scalar(db.select(Tenant).where(Tenant.id == tenant_id)
                         .with_for_update()) is None:
        raise NotFound("no such tenant")
    try:
        if retrain_of is not None and retrain_of.state != states.RETIRED:
            service.transition(user, retrain_of, "retire", comment, commit=False,
                               data={"retrained": True})
        busy = db.session.scalar(db.select(Adapter).where(
            Adapter.tenant_id == tenant_id, Adapter.workflow == workflow,
            Adapter.state.in_(states.IN_FLIGHT)).limit(1))
        if busy is not None:
            raise Conflict(f"adapter {busy.name} of this workflow is "
                           f"{busy.state.replace('_', ' ')}; finish, cancel or retire it first")
        hp = validate_hyperparams(hyperparams)
        pool = tier1_pool()
        policy = effective_policy(tenant_id)
        dataset = freeze_dataset(tenant_id, workflow,
                                 min_traces=int(policy["distill_min_traces"]),
                                 heldout_fraction=heldout_fraction, created_by=user.email,
                                 form=served_form(policy, pool))
        if retrain_of is not None and dataset.id == retrain_of.dataset_id:
            raise ValidationError(
                f"no new traces: the workflow's {dataset.n_train + dataset.n_heldout} usable "
                f"traces are the ones {retrain_of.name} was trained on",
                {"workflow": ["retrain once more traces have come in"]})
        adapter = _new_adapter(user, tenant_id, workflow, hp, pool, dataset,
                               retrain_of=retrain_of, comment=comment,
                               form=form_of(policy))
        db.session.commit()
    except ServiceError:
        db.session.rollback()
        raise
    current_app.extensions["celery"].send_task(
        "adapters.train", args=[adapter.id], queue=current_app.config["ADAPTERS_TRAIN_QUEUE"])
    return adapter


def retrain(user, adapter_id: int, comment: str = "") -> Adapter:
    """A new adapter of the same tenant workflow, with the same hyperparameters, trained on
    the workflow's usable traces as they are now; the adapter it replaces is retired in the
    same commit (and unloaded when it was in shadow). What an ML engineer does with an
    adapter the shadow gate held back once more traces have come in. Returns the new
    adapter (in training). Conflict from a state that serves or is in flight, Forbidden
    without adapter.train, ValidationError when no trace has come in since."""
    from app.adapters.rollout import _send_lora
    from app.snapshot.service import publish_after_commit
    old = service.get_adapter(user, adapter_id)
    if not user.can("adapter.train", old.tenant_id):
        raise Forbidden(f"your role ({user.role}) may not train adapters for this tenant")
    if old.state not in states.RETRAINABLE:
        raise Conflict(f"cannot retrain an adapter that is {old.state.replace('_', ' ')}: "
                       f"only one nobody serves and nothing trains")
    was = old.state
    adapter = request_training(user, old.tenant_id, old.workflow,
                               hyperparams=old.hyperparams, retrain_of=old, comment=comment)
    if was == states.SHADOW:
        _send_lora(old, "unload")
        publish_after_commit()
    return adapter


def cancel_training(user, adapter_id: int, comment: str = "") -> Adapter:
    """Cancel an adapter in training; the task stops at its next step, storing nothing."""
    adapter = service.get_adapter(user, adapter_id)
    return service.transition(user, adapter, "cancel", comment)


# --- the fit (no database: the bench calls it too) --------------------------------------
def base_model_path(model: str) -> str:
    """Where to load the pool's model from: ``smollm2`` or a local folder through the
    engine's resolver; another name as it is (a model id in the node's HF cache)."""
    from app.engine.model import SMOLLM2, resolve_model_path
    try:
        return str(resolve_model_path(model))
    except FileNotFoundError:
        if model == SMOLLM2 or model.startswith(("/", ".")):
            raise
        return model


def _encode(tok, record: dict, max_len: int) -> tuple[list[int], list[int]]:
    """(input ids, labels): the chat-templated prompt (masked) and the answer with the
    end-of-turn token; the prompt is cut from the left when the pair is too long."""
    prompt = tok.encode(chat_prompt(tok, record["messages"]), add_special_tokens=False)
    answer = tok.encode(record["answer"] + (tok.eos_token or ""), add_special_tokens=False)
    answer = answer[:max_len]
    prompt = prompt[max(0, len(prompt) - (max_len - len(answer))):]
    return prompt + answer, [-100] * len(prompt) + answer


def fit_lora(base_path: str, records: list[dict], hp: dict[str, Any], out_dir: Path, *,
             on_step: Callable[[int, int, float], bool] | None = None) -> dict[str, Any] | None:
    """Train a LoRA on ``records`` and save it (adapter files only) to ``out_dir``.
    ``on_step(step, steps, loss)`` returning False stops it: None, nothing saved."""
    import torch
    from peft import LoraConfig, get_peft_model
    started = time.perf_counter()
    tok, model = load_base(base_path)
    torch.manual_seed(int(hp["seed"]))
    model = get_peft_model(model, LoraConfig(
        r=int(hp["rank"]), lora_alpha=float(hp["alpha"]), lora_dropout=float(hp["dropout"]),
        target_modules=list(hp["target_modules"]), task_type="CAUSAL_LM"))
    examples = [_encode(tok, r, int(hp["max_seq_len"])) for r in records]
    if not examples:
        raise ValidationError("no training traces in the dataset")
    steps, size = planned_steps(len(examples), hp), int(hp["batch_size"])
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=float(hp["lr"]), weight_decay=0.0)
    rng, order, loss_value = random.Random(int(hp["seed"])), [], float("nan")
    pad = tok.pad_token_id
    model.train()
    for step in range(1, steps + 1):
        if not order:
            order = list(range(len(examples)))
            rng.shuffle(order)
        batch = [examples[order.pop()] for _ in range(min(size, len(order)))]
        width = max(len(ids) for ids, _ in batch)
        dev = model.device
        ids = torch.tensor([i + [pad] * (width - len(i)) for i, _ in batch], device=dev)
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in batch], device=dev)
        mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i, _ in batch], device=dev)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_value = float(loss.detach())
        if on_step is not None and on_step(step, steps, loss_value) is False:
            return None
    model.save_pretrained(out_dir)
    (Path(out_dir) / "README.md").unlink(missing_ok=True)  # peft's model card: not the adapter
    return {"steps": steps, "final_loss": round(loss_value, 5), "n_train": len(examples),
            "train_seconds": round(time.perf_counter() - started, 2),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def artifact_sha256(folder: Path) -> str:
    """sha256 over the adapter's files (names and contents; manifest.json excluded)."""
    h = hashlib.sha256()
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if rel == MANIFEST:
            continue
        h.update(rel.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


# --- the task ------------------------------------------------------------------------
def _tmp_root() -> Path:
    return adapters_dir() / "tmp"


def _progress(adapter: Adapter, started: float) -> Callable[[int, int, float], bool]:
    """on_step for fit_lora: progress committed every ~1/HISTORY_POINTS of the run, and
    False once the adapter is no longer in training (cancelled)."""
    history: list[list[float]] = []
    adapter_id = adapter.id

    def on_step(step: int, steps: int, loss: float) -> bool:
        every = max(1, steps // HISTORY_POINTS)
        if step % every == 0 or step == steps or step == 1:
            elapsed = time.perf_counter() - started
            history.append([step, round(loss, 5)])
            adapter.progress = {"phase": "training", "step": step, "steps": steps,
                                "loss": round(loss, 5),
                                "eta_s": round(elapsed / step * (steps - step), 1),
                                "history": list(history)}
            db.session.commit()
        state = db.session.scalar(db.select(Adapter.state).where(Adapter.id == adapter_id))
        db.session.commit()   # end the read's transaction: the next one sees a cancel
        return state == states.TRAINING

    return on_step


def _locked(adapter: Adapter) -> Adapter:
    """Reload ``adapter`` with its row locked (until the next commit)."""
    db.session.refresh(adapter, with_for_update=True)
    return adapter


def _manifest(adapter: Adapter, base_path: str, metrics: dict, sha: str) -> dict[str, Any]:
    import peft
    import transformers
    return {"adapter": adapter.name, "sha256": sha, "base_model": adapter.base_model,
            "base_model_path": base_path, "dataset_sha256": adapter.dataset.sha256,
            "hyperparams": adapter.hyperparams, "metrics": metrics,
            "created_at": datetime.now(timezone.utc).isoformat(),
            "peft": peft.__version__, "transformers": transformers.__version__}


def _store_artifact(adapter: Adapter, tmp: Path, base_path: str, metrics: dict) -> Path:
    """Move the trained folder to ``artifacts/<sha256>/`` (an existing one is reused,
    never overwritten) and record it on the adapter (committed)."""
    sha = artifact_sha256(tmp)
    final = adapters_dir() / "artifacts" / sha
    manifest = _manifest(adapter, base_path, metrics, sha)
    if _locked(adapter).state != states.TRAINING:
        raise _Cancelled()
    final.parent.mkdir(parents=True, exist_ok=True)
    if not final.exists():
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "adapter_config.json").exists():
                raise
    shutil.rmtree(tmp, ignore_errors=True)
    adapter.sha256, adapter.artifact_path, adapter.manifest = sha, str(final), manifest
    adapter.progress = {**(adapter.progress or {}), "phase": "evaluating"}
    db.session.commit()
    return final


def _artifact_ok(adapter: Adapter) -> bool:
    path = Path(adapter.artifact_path) if adapter.artifact_path else None
    return bool(path and (path / "adapter_config.json").exists() and adapter.sha256
                and artifact_sha256(path) == adapter.sha256)


def _discard_artifact(adapter: Adapter) -> None:
    """Forget the adapter's artifact; delete its folder unless another adapter has it."""
    if not adapter.artifact_path:
        return
    shared = db.session.scalar(db.select(db.func.count()).select_from(Adapter).where(
        Adapter.sha256 == adapter.sha256, Adapter.id != adapter.id))
    if not shared:
        shutil.rmtree(adapter.artifact_path, ignore_errors=True)
    adapter.sha256, adapter.artifact_path = None, None


def _stopped(adapter_id: int, why: str, error: str = "") -> dict[str, Any]:
    db.session.rollback()
    adapter = db.session.get(Adapter, adapter_id)
    _discard_artifact(adapter)
    adapter.progress = {**(adapter.progress or {}), "phase": why}
    if error:
        adapter.error = error[:4000]
    if error and adapter.state == states.TRAINING:
        service.transition(service.SYSTEM, adapter, "fail", error[:500])
    else:
        db.session.commit()
    return {"adapter_id": adapter_id, "state": adapter.state, "stopped": why}


def _per_1k(per_request: Decimal) -> str:
    from app.core.costing import shown
    return str(shown(per_request * 1000))


def cost_per_1k(adapter: Adapter, offline: dict[str, Any]) -> dict[str, Any]:
    """What 1k of the workflow's requests cost before and with the adapter (USD strings
    to the micro-dollar).

    Before: the workflow's own ledger (its requests over ``ADAPTERS_COST_WINDOW_DAYS``:
    what its route costs today, cache hits and escalations included); a workflow with
    no ledger rows yet is priced as all-frontier at the held-out tokens. After: the
    adapter's tier at the held-out prompt tokens and the tokens the adapter generated."""
    from datetime import timedelta

    import sqlalchemy as sa

    from app.catalog.models import Tier
    from app.core.pricing import tier_cost
    from app.finops.prices import price_schedules
    from app.ledger.models import LedgerEntry as L
    since = datetime.now(timezone.utc) - timedelta(
        days=int(current_app.config["ADAPTERS_COST_WINDOW_DAYS"]))
    n, total = db.session.execute(
        sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(L.cost_usd), 0))
        .where(L.kind == "request", L.tenant_id == adapter.tenant_id,
               L.workflow == adapter.workflow, L.at >= since)).one()
    prompt = round(float(offline.get("prompt_tokens") or 0))
    tiers = list(db.session.scalars(db.select(Tier).where(Tier.enabled.is_(True))
                                    .order_by(Tier.rank)))
    ours = next((t for t in tiers if t.pool_id == adapter.pool_id), tiers[0] if tiers else None)
    priced = price_schedules()   # each tier at the price in force now (dated changes)
    out: dict[str, Any] = {}
    if n:
        out["cost_per_1k_before"] = _per_1k(Decimal(str(total)) / n)
        out["cost_before_source"] = f"ledger: {n} requests in {since:%Y-%m-%d}..today"
    elif tiers:
        out["cost_per_1k_before"] = _per_1k(tier_cost(
            priced[tiers[-1].name], None, prompt, 0,
            round(float(offline.get("reference_tokens") or 0))))
        out["cost_before_source"] = f"no ledger rows yet: all on {tiers[-1].name} at the " \
                                    f"held-out tokens"
    if ours is not None:
        out["cost_per_1k_after"] = _per_1k(tier_cost(
            priced[ours.name], None, prompt, 0, round(float(offline.get("tokens") or 0))))
    return out


def train_adapter(adapter_id: int) -> dict[str, Any]:
    """The ``adapters.train`` task (idempotent under redelivery; see the module docstring)."""
    adapter = db.session.get(Adapter, adapter_id)
    if adapter is None or adapter.state != states.TRAINING:
        return {"adapter_id": adapter_id, "skipped": adapter.state if adapter else "missing"}
    tmp: Path | None = None
    try:
        base_path = base_model_path(adapter.base_model)
        if adapter.dataset is None:
            raise NotFound("the adapter's dataset is gone")
        if not _artifact_ok(adapter):
            _discard_artifact(adapter)
            for stale in _tmp_root().glob(f"adapter-{adapter_id}-*"):
                shutil.rmtree(stale, ignore_errors=True)   # a killed attempt's
            train, _ = read_dataset(adapter.dataset)
            tmp = _tmp_root() / f"adapter-{adapter_id}-{uuid.uuid4().hex[:8]}"
            tmp.mkdir(parents=True)
            metrics = fit_lora(base_path, train, adapter.hyperparams, tmp,
                               on_step=_progress(adapter, time.perf_counter()))
            if metrics is None:
                raise _Cancelled()
            _store_artifact(adapter, tmp, base_path, metrics)
            tmp = None
        _, heldout = read_dataset(adapter.dataset)
        cfg = current_app.config
        offline = evaluate_offline(base_path, adapter.artifact_path, heldout,
                                   cap=int(cfg["ADAPTERS_EVAL_MAX_NEW_TOKENS"]),
                                   batch=int(cfg["ADAPTERS_EVAL_BATCH"]))
        if _locked(adapter).state != states.TRAINING:
            raise _Cancelled()
        adapter.offline = {**offline, **cost_per_1k(adapter, offline)}
        adapter.progress = {**(adapter.progress or {}), "phase": "done"}
        service.transition(service.SYSTEM, adapter, "trained",
                           f"offline concordance {offline['concordance']:.3f} "
                           f"(base {offline['base_concordance']:.3f}, n={offline['n']})",
                           data={"sha256": adapter.sha256, "offline": {
                               k: offline[k] for k in ("n", "concordance", "ci_low", "ci_high",
                                                       "base_concordance")}})
        return {"adapter_id": adapter_id, "state": adapter.state, "sha256": adapter.sha256}
    except _Cancelled:
        _drop(tmp)            # before the adapter says it stopped: nothing is left then
        tmp = None
        return _stopped(adapter_id, "cancelled")
    except Exception as exc:  # noqa: BLE001 - every failure is the adapter's "failed"
        log.exception("adapter %s: training failed", adapter_id)
        _drop(tmp)
        tmp = None
        return _stopped(adapter_id, "failed", f"{type(exc).__name__}: {exc}")
    finally:
        _drop(tmp)


def _drop(tmp: Path | None) -> None:
    """Remove a training attempt's scratch directory (None: nothing to remove)."""
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
