"""The LoRA flywheel inside bench/replay.py's month (variant ``full_adapters``), run through
the product's own code paths; the bench plays the people who click.

At every checkpoint of the compressed clock (after the ledger drain), in this order:

1. ``drain_traces`` (what beat's ``adapters.drain_traces`` runs every 5 s): the gateway's
   captured frontier answers of each workflow into ``adapter_traces``.
2. ``shadow_rollup`` (beat's ``adapters.shadow_rollup``): each adapter in shadow gets its
   live concordance with the frontier's answers; one that met the gate (at least
   ``SHADOW_MIN_REQUESTS`` shadowed answers, concordance at or above the tenant's
   ``shadow_concordance``, product default 0.99) is submitted for approval by the product.
3. The approving ML engineer (a console user with role ``approver``, not the requester)
   approves every adapter the gate submitted, through the admin API
   (``POST /api/v1/adapters/<id>/approve`` with a comment naming the evidence), then clicks
   "next canary step" twice (5% -> 25% -> promoted). The canary steps are clicked at once:
   the replayed month is too short for a canary to gather evidence; the canary watch
   (``canary_watch``, beat's ``adapters.canary_watch``) runs at every checkpoint and rolls
   a promoted adapter back on its own if its live pass rate regresses.
4. The ML engineer (role ``ops``) asks for a training, through the admin API
   (``POST /api/v1/adapters`` with the tenant, workflow and hyperparameters), of every
   workflow with no adapter yet whose usable traces reached the tenant's
   ``distill_min_traces``; the product freezes the dataset and queues ``adapters.train``,
   which the stack's Celery worker runs (PEFT LoRA on SmolLM2-135M-Instruct, CPU, then the
   offline evaluation on the held-out split). The month clock is paused while it trains.
   A candidate is then put in shadow (``POST .../shadow``).
5. The same ML engineer retrains an adapter the shadow gate has judged and held back
   (at least ``SHADOW_MIN_REQUESTS`` shadowed answers, concordance below the gate), once the
   workflow's usable traces have grown to ``RETRAIN_GROWTH`` x what it was trained on
   (``POST .../retrain``, a comment with its shadow figures: the adapter is retired, and
   unloaded from the engines by the node's own function, and a new one trained on every
   usable trace, same hyperparameters, which starts its own shadow record). An adapter whose offline concordance was 0% is not retrained (the stand-in
   learnt nothing of the workflow from its traces; more of the same is not what it needs),
   and the report says so.

The hot-(un)loads the rollout queues on the pool's node queue are run by this process
with the node's own function (``app.adapters.node.load_adapter``, what the
``adapters.load`` task runs): the stack's engines are not managed by a pool worker.

Scaled to the replay (a month here is ~1/1000 of a production month; stated in the
output): ``distill_min_traces`` 2500 -> ``DISTILL_MIN_TRACES``,
``ADAPTERS_SHADOW_MIN_REQUESTS`` 200 -> ``SHADOW_MIN_REQUESTS``, and the shadow sample
share 10% -> 100% (the adapter's own ``shadow.sample_pct``, set as tests/e2e does).
Hyperparameters: what bench/flywheel.py found for a templated extraction (rank 8, alpha
16, lr 1e-3, 2 epochs, batch 4), sent with the training request (the API takes them per
training). ``shadow_concordance`` stays at the product default.
"""
from __future__ import annotations

import time
from typing import Any

DISTILL_MIN_TRACES = 40
SHADOW_MIN_REQUESTS = 10
SHADOW_SAMPLE_PCT = 100
# max_seq_len: the product's default, which fits contract-qa's ~830-token prompts
# (bench/results/replay_distill.txt: 16/16 held out from 48 traces in 303 s; at 512 the
# contract was cut from the left); batches pad to their longest example, not to this
HYPERPARAMS = {"rank": 8, "alpha": 16, "lr": 1e-3, "epochs": 2, "batch_size": 4,
               "max_seq_len": 1024}
# Not trained in this replay, and why (printed): none since replay_distill showed the stand-in
# learns contract-qa (it was skipped as over max_seq_len 512)
SKIP: dict[str, str] = {}
TRAIN_TIMEOUT_S = 1800
# The run's CPU budget for training (month clock paused): once spent, no further training
# is requested and the report says which workflows were left untrained for it.
TRAIN_BUDGET_S = 1500.0
# Retrain a shadow adapter the gate held back once the workflow's usable traces reach this
# multiple of its training set's traces.
RETRAIN_GROWTH = 1.25


class Flywheel:
    def __init__(self, stack, tenant_ids: dict[str, int], log=print,
                 skip: dict[str, str] | None = None, prior_months: int = 0):
        self.stack = stack
        self.tenant_ids = tenant_ids            # tenant spec name -> id
        self.names = {v: k for k, v in tenant_ids.items()}
        self.log = log
        self.skip = SKIP if skip is None else skip
        self.paused_s = 0.0
        self.events: list[str] = []
        self.records: dict[tuple[int, str], dict[str, Any]] = {}
        self.prior_months = prior_months
        self.measured_h = 0            # month-hour the measured month starts (prior months)
        self.since = None              # wall time it started: the report's rows from then
        self.until = None              # an ablation's measured pass ends here (wall time)

    def mark_measured(self, hour: int) -> None:
        from datetime import datetime, timezone
        self.measured_h = hour
        self.since = datetime.now(timezone.utc)
        self._say(hour, "the measured month starts (the months before: the flywheel's "
                        "prior months, not in the figures)")

    # --- helpers ------------------------------------------------------------------
    def _say(self, hour: int, text: str) -> None:
        month, h = divmod(hour, 720)
        line = (f"month {month + 1} day {h / 24:4.1f}: {text}" if self.prior_months
                else f"day {hour / 24:4.1f}: {text}")
        self.events.append(line)
        self.log(f"  [flywheel] {line}")

    def _api(self, method: str, path: str, who: str, body: dict | None = None) -> dict:
        r = self.stack.api(method, path, who, body)
        if r.status_code >= 300:
            raise RuntimeError(f"{method} {path} as {who}: {r.status_code} {r.get_data(as_text=True)[:300]}")
        return r.get_json()

    def _adapter(self, adapter_id: int):
        from app.adapters.models import Adapter
        from app.extensions import db
        db.session.expire_all()
        return db.session.get(Adapter, adapter_id)

    def _load(self, adapter_id: int) -> dict:
        """What the node's ``adapters.load`` task runs (hot-load on every replica of the
        tier-1 pool; publishes the snapshot), then wait for the gateway to have it."""
        from app.adapters.node import load_adapter
        loaded = load_adapter(adapter_id)
        self.stack.publish()
        return loaded

    def _unload(self, adapter_id: int) -> dict:
        """What the node's ``adapters.unload`` task runs when an adapter in shadow is
        retired (the engines hold at most --max-loras adapters: a retired one left loaded
        takes a slot a new one needs; a first run with retraining filled all 8 and every
        adapter after that failed to load)."""
        from app.adapters.node import unload_adapter
        unloaded = unload_adapter(adapter_id)
        self.stack.publish()
        return unloaded

    # --- one checkpoint -----------------------------------------------------------
    def step(self, hour: int) -> None:
        from app.adapters.serving import shadow_rollup
        from app.adapters.traces import drain_traces
        from app.adapters.watch import canary_watch
        from app.extensions import db
        drain_traces(max_batches=100, min_idle_ms=5_000)
        for line in shadow_rollup(min_requests=SHADOW_MIN_REQUESTS):
            a = self._adapter(line["id"])
            rec = self.records.get((a.tenant_id, a.workflow))
            if rec is not None:
                rec["shadow"] = {k: line[k] for k in ("requests", "agreed", "concordance",
                                                      "ci_low", "ci_high")}
            if line["submitted"]:
                self._say(hour, f"{self._who(a)}: shadow gate met ({line['agreed']}/"
                                f"{line['requests']} agreed); submitted for approval")
        db.session.expire_all()
        self._approve_submitted(hour)
        self._retrain_held_back(hour)
        for line in canary_watch():
            if line["rolled_back"]:
                a = self._adapter(line["id"])
                self._say(hour, f"{self._who(a)}: rolled back by the canary watch: {line['why']}")
                self.records[(a.tenant_id, a.workflow)]["rolled_back_h"] = hour
        self._train_ready(hour)

    def _who(self, a) -> str:
        return f"{self.names.get(a.tenant_id, a.tenant_id)}/{a.workflow} ({a.name})"

    def _approve_submitted(self, hour: int) -> None:
        from app.adapters import states
        from app.adapters.models import Adapter
        from app.extensions import db
        waiting = list(db.session.scalars(db.select(Adapter).where(
            Adapter.state == states.AWAITING, Adapter.tenant_id.in_(list(self.names)))))
        for a in waiting:
            sh, off = a.shadow or {}, a.offline or {}
            comment = (f"offline {off.get('concordance', 0):.0%} vs base "
                       f"{off.get('base_concordance', 0):.0%} (n={off.get('n')}); shadow "
                       f"{sh.get('agreed')}/{sh.get('requests')} agreed with the frontier")
            self._api("POST", f"/api/v1/adapters/{a.id}/approve", "approver",
                      {"comment": comment})
            loaded = self._load(a.id)
            for _ in range(2):
                self._api("POST", f"/api/v1/adapters/{a.id}/advance", "approver", {})
            a = self._adapter(a.id)
            self.stack.publish()
            rec = self.records[(a.tenant_id, a.workflow)]
            rec["promoted_h"] = hour
            self._say(hour, f"{self._who(a)}: approved and stepped to {a.state} "
                            f"(loaded {loaded})")

    def _train_ready(self, hour: int) -> None:
        from app.adapters.models import Adapter, AdapterTrace
        from app.adapters.traces import count_usable
        from app.extensions import db
        from app.policies.service import effective_policy
        pairs = db.session.execute(db.select(AdapterTrace.tenant_id, AdapterTrace.workflow)
                                   .where(AdapterTrace.tenant_id.in_(list(self.names)))
                                   .distinct()).all()
        for tenant_id, workflow in sorted(pairs):
            key = (tenant_id, workflow)
            if key in self.records:
                continue
            if db.session.scalar(db.select(Adapter.id).where(
                    Adapter.tenant_id == tenant_id, Adapter.workflow == workflow).limit(1)):
                continue
            need = int(effective_policy(tenant_id)["distill_min_traces"])
            have = count_usable(tenant_id, workflow)
            if have < need:
                continue
            if self.paused_s >= TRAIN_BUDGET_S:
                self.records[key] = {"skipped": f"the run's training budget ({TRAIN_BUDGET_S:.0f} s "
                                                f"of CPU, month clock paused) was spent",
                                     "traces": have, "ready_h": hour}
                self._say(hour, f"{self.names[tenant_id]}/{workflow}: {have} traces, not "
                                f"trained: {self.records[key]['skipped']}")
                continue
            if workflow in self.skip:
                self.records[key] = {"skipped": self.skip[workflow], "traces": have,
                                     "ready_h": hour}
                self._say(hour, f"{self.names[tenant_id]}/{workflow}: {have} traces, "
                                f"not trained: {self.skip[workflow]}")
                continue
            self._train(hour, tenant_id, workflow, have)

    def _retrain_held_back(self, hour: int) -> None:
        from app.adapters import states
        from app.adapters.traces import count_usable
        from app.policies.service import effective_policy
        for (tenant_id, workflow), rec in sorted(self.records.items()):
            if "adapter_id" not in rec:
                continue
            a = self._adapter(rec["adapter_id"])
            sh, off = a.shadow or {}, a.offline or {}
            gate = float(effective_policy(tenant_id)["shadow_concordance"])
            if (a.state != states.SHADOW or int(sh.get("requests") or 0) < SHADOW_MIN_REQUESTS
                    or float(sh.get("concordance") or 0) >= gate):
                continue
            if not off.get("concordance"):
                if not rec.get("no_retrain"):
                    rec["no_retrain"] = True
                    self._say(hour, f"{self._who(a)}: held back by the shadow gate "
                                    f"({sh['agreed']}/{sh['requests']}); not retrained: offline "
                                    f"concordance 0% (the stand-in learnt nothing of it)")
                continue
            have = count_usable(tenant_id, workflow)
            if have < RETRAIN_GROWTH * rec["traces"] or self.paused_s >= TRAIN_BUDGET_S:
                continue
            why = (f"shadow {sh['agreed']}/{sh['requests']} agreed ({float(sh['concordance']):.1%}, "
                   f"gate {gate:.0%}); retraining on {have} usable traces (was {rec['traces']})")
            self._say(hour, f"{self._who(a)}: retrain: {why}")
            self._train(hour, tenant_id, workflow, have, retrain_of=a.id, comment=why)
            self._unload(a.id)

    def _train(self, hour: int, tenant_id: int, workflow: str, have: int, *,
               retrain_of: int | None = None, comment: str = "") -> None:
        from app.adapters import states
        if retrain_of is None:
            got = self._api("POST", "/api/v1/adapters", "ml",
                            {"tenant_id": tenant_id, "workflow": workflow,
                             "hyperparams": HYPERPARAMS})["adapter"]
        else:   # the product's retrain: retires the old one, same hyperparameters
            got = self._api("POST", f"/api/v1/adapters/{retrain_of}/retrain", "ml",
                            {"comment": comment})["adapter"]
        rec = self.records[(tenant_id, workflow)] = {"adapter_id": got["id"], "traces": have,
                                                     "requested_h": hour}
        self._say(hour, f"{self.names[tenant_id]}/{workflow}: {have} traces; training "
                        f"{got['name']} ({got['progress'].get('steps')} steps); month clock "
                        f"paused")
        t0 = time.perf_counter()
        deadline = time.monotonic() + TRAIN_TIMEOUT_S
        while time.monotonic() < deadline:
            a = self._adapter(got["id"])
            if a.state != states.TRAINING:
                break
            time.sleep(2)
        wall = time.perf_counter() - t0
        self.paused_s += wall
        a = self._adapter(got["id"])
        off = a.offline or {}
        rec.update(train_s=wall, state_after_training=a.state, offline=off, error=a.error,
                   n_train=(a.dataset.n_train if a.dataset else None))
        if a.state != states.CANDIDATE:
            self._say(hour, f"{self._who(a)}: training ended {a.state} after {wall:.0f} s "
                            f"{a.error[:200]}")
            return
        self._say(hour, f"{self._who(a)}: trained in {wall:.0f} s; offline concordance "
                        f"{off.get('concordance', 0):.0%} (base {off.get('base_concordance', 0):.0%}, "
                        f"n={off.get('n')}); into shadow")
        self._api("POST", f"/api/v1/adapters/{a.id}/shadow", "ml", {})
        from app.extensions import db
        a = self._adapter(a.id)
        a.shadow = {**(a.shadow or {}), "sample_pct": SHADOW_SAMPLE_PCT}
        db.session.commit()
        self._load(a.id)

    # --- the report ---------------------------------------------------------------
    def report(self) -> list[str]:
        """Per tenant workflow: what the flywheel did, and what tier 1 then served (from
        the ledger and the adapters' own records)."""
        import sqlalchemy as sa

        from app.adapters.models import Adapter, AdapterTrace
        from app.cascade.models import RouterModel
        from app.extensions import db
        from app.ledger.models import LedgerEntry as L
        from app.policies.service import effective_policy
        db.session.expire_all()
        lines = [f"Flywheel (full_adapters): hyperparameters {HYPERPARAMS}; scaled to the replay: "
                 f"distill_min_traces {DISTILL_MIN_TRACES} (product 2500), shadow gate "
                 f"{SHADOW_MIN_REQUESTS} answers (product 200) at 100% sampling (product 10%), "
                 f"shadow_concordance at the product default; an adapter the gate held back retrained at "
                 f"{RETRAIN_GROWTH}x its traces; month clock paused "
                 f"{self.paused_s:.0f} s for training (budget {TRAIN_BUDGET_S:.0f} s)",
                 f"  {'tenant/workflow':<36} {'req':>4} {'traces':>6} {'offline lora/base':>17} "
                 f"{'shadow agreed':>13} {'adapter':>10} {'router':>22} {'T1 rows':>7} {'T1 pass':>7}"]
        since = [L.at >= self.since] if self.since is not None else []
        if self.until is not None:
            since.append(L.at < self.until)
        if self.since is not None:
            lines.insert(1, f"  (req and T1 columns: the measured month; the rest: since the "
                            f"first of the {self.prior_months} prior month(s))")
        pairs = db.session.execute(
            sa.select(L.tenant_id, L.workflow, sa.func.count())
            .where(L.tenant_id.in_(list(self.names)), L.kind == "request", *since)
            .group_by(L.tenant_id, L.workflow)).all()
        for tenant_id, workflow, n_req in sorted(pairs, key=lambda p: (self.names[p[0]], p[1] or "")):
            if not workflow:
                continue
            rec = self.records.get((tenant_id, workflow), {})
            traces = db.session.scalar(sa.select(sa.func.count()).select_from(AdapterTrace).where(
                AdapterTrace.tenant_id == tenant_id, AdapterTrace.workflow == workflow))
            a = db.session.scalar(sa.select(Adapter).where(
                Adapter.tenant_id == tenant_id, Adapter.workflow == workflow)
                .order_by(Adapter.id.desc()).limit(1))
            off = (a.offline or {}) if a else {}
            sh = (a.shadow or {}) if a else {}
            offline = f"{off['concordance']:.0%}/{off['base_concordance']:.0%} n={off['n']}" \
                if "concordance" in off else "-"
            shadow = f"{sh.get('agreed')}/{sh.get('requests')}" if sh.get("requests") else "-"
            scope = f"tenant:{tenant_id}:wf:{workflow}"
            versions = list(db.session.scalars(sa.select(RouterModel).where(
                RouterModel.scope == scope).order_by(RouterModel.version)))
            active = next((v for v in versions if v.status == "active"), None)
            if active is None:
                router = f"{len(versions)} v, none active"
            else:
                taus = (active.metrics or {}).get("taus") or {}
                fo = ((active.metrics or {}).get("promotion") or {}).get("frontier_only")
                router = f"v{active.version}/{len(versions)} " + (
                    "frontier only" if fo else f"τ1 {float(taus.get('1', 1)):.2f}")
            t1 = db.session.execute(sa.select(L.payload).where(
                L.tenant_id == tenant_id, L.workflow == workflow, L.kind == "request", *since,
                L.tier == "tier-1", L.cache == "miss")).all()
            verdicts = [((p or {}).get("feedback") or {}).get("pass") for (p,) in t1]
            judged = [v for v in verdicts if isinstance(v, bool)]
            t1_pass = f"{sum(judged) / len(judged):.0%}" if judged else "-"
            lines.append(f"  {self.names[tenant_id] + '/' + workflow:<36} {n_req:>4} {traces:>6} "
                         f"{offline:>17} {shadow:>13} {(a.state if a else '-'):>10} "
                         f"{router:>22} {len(t1):>7} {t1_pass:>7}")
            need = int(effective_policy(tenant_id)["distill_min_traces"])
            if "skipped" in rec:
                lines.append(f"      not trained: {rec['skipped']}")
            elif a is None:
                lines.append(f"      not trained: {traces} usable traces, "
                             f"{need} needed (distill_min_traces)")
            elif a.state == "shadow":
                thr = float(effective_policy(tenant_id)["shadow_concordance"])
                lines.append(f"      stayed in shadow: concordance {sh.get('concordance', 0):.1%} "
                             f"over {sh.get('requests', 0)} shadowed answers (gate: >= {thr:.0%} "
                             f"over >= {SHADOW_MIN_REQUESTS})")
            elif a.state in ("failed", "cancelled"):
                lines.append(f"      training {a.state}: {a.error[:200]}")
            if versions and active is not None and not (active.metrics or {}).get(
                    "promotion", {}).get("frontier_only"):
                pass
            elif versions:
                last = versions[-1]
                why = ((last.metrics or {}).get("comparison") or {}).get("reason", "")
                lines.append(f"      router v{last.version} ({last.status}): {why[:240]}")
        lines.append("  timeline:")
        lines += [f"    {e}" for e in self.events]
        return lines
