"""The Redis keyspace both planes share. Every key a gateway, an engine-side worker or a
control-plane service reads or writes is spelt here, once, as a named method; nothing
else builds a key by hand.

All keys live under the configured namespace (``REDIS_NAMESPACE``, default ``sluice``),
so two deployments or two test sessions on one Redis never see each other's keys.
"""
from __future__ import annotations

from datetime import date


class Keys:
    """Namespaced key names: ``Keys("sluice").snapshot_version() == "sluice:snapshot:version"``."""

    def __init__(self, namespace: str) -> None:
        self.ns = namespace

    def k(self, *parts: object) -> str:
        """A key under the namespace; prefer the named methods below."""
        return ":".join([self.ns, *map(str, parts)])

    # --- config snapshot (control plane writes, gateways poll) -----------------------
    def snapshot_version(self) -> str:
        return self.k("snapshot", "version")

    def snapshot_data(self) -> str:
        return self.k("snapshot", "data")

    def snapshot_seq(self) -> str:
        """Versions handed out to builds (INCR before the build reads the database);
        ``snapshot_version`` is the one stored, which only ever moves forward."""
        return self.k("snapshot", "seq")

    def snapshot_changed(self) -> str:
        """Pub/sub channel announcing a new snapshot version."""
        return self.k("snapshot", "changed")

    # --- ledger and feedback streams (gateways append, the drain commits) -----------
    def ledger_stream(self) -> str:
        return self.k("ledger", "stream")

    def ledger_dead(self) -> str:
        """Events the drain could not parse, kept for an operator."""
        return self.k("ledger", "dead")

    def feedback_stream(self) -> str:
        return self.k("feedback", "stream")

    def feedback_retry(self) -> str:
        """Feedback whose request the drain had not committed yet."""
        return self.k("ledger", "feedback_retry")

    def trace_stream(self) -> str:
        """Frontier answers of workflows (scrubbed) the LoRA flywheel may learn from."""
        return self.k("adapters", "traces")

    def request_owners(self, day: date) -> str:
        """Hash request_id -> tenant id of the requests booked on ``day`` (UTC)."""
        return self.k("req", day.strftime("%Y%m%d"))

    # --- console ---------------------------------------------------------------------
    def secret_reveal(self, token: str) -> str:
        """A just-created key's plaintext, held for the one redirect that shows it
        (``app.console.reveal``: single use, short TTL)."""
        return self.k("console", "reveal", token)

    # --- admission -----------------------------------------------------------------
    def rate_limit(self, tenant_id: object, minute: int) -> str:
        return self.k("ratelimit", tenant_id, minute)

    def budget_spent(self, tenant_id: object, period: str) -> str:
        return self.k("budget", tenant_id, period)

    def budget_reserved(self, tenant_id: object, period: str) -> str:
        return self.k("budget", tenant_id, period, "reserved")

    def budget_refused(self, tenant_id: object, period: str) -> str:
        return self.k("budget", tenant_id, period, "refused")

    def budget_unbooked(self, tenant_id: object) -> str:
        return self.k("budget", tenant_id, "unbooked")

    def budget_limit(self, tenant_id: object) -> str:
        return self.k("budget", tenant_id, "limit")

    def budget_booking_lock(self) -> str:
        return self.k("budget", "booking_lock")

    def budget_holds(self, instance: str) -> str:
        """Hash request_id -> "<reserved key>|<micro>|<deadline epoch>": the budget holds
        one gateway instance has out (``app.contract.leases``)."""
        return self.k("budget", "holds", instance)

    # --- gateway instances (leases: a hold lives while its owner's heartbeat does) ---
    def gateway_instances(self) -> str:
        """Set of gateway instance ids that have (or had) holds out."""
        return self.k("gateway", "instances")

    def gateway_alive(self, instance: str) -> str:
        """A gateway instance's heartbeat (short TTL, renewed while it runs)."""
        return self.k("gateway", instance, "alive")

    # --- replicas (gateways count load; node workers write stats) --------------------
    def replica_inflight(self, replica_id: object) -> str:
        return self.k("replica", replica_id, "inflight")

    def replica_inflight_seen(self, replica_id: object) -> str:
        return self.k("replica", replica_id, "inflight_seen")

    def replica_stats(self, replica_id: object) -> str:
        return self.k("replica", replica_id, "stats")

    def replica_kv_blocks(self, replica_id: object) -> str:
        """Set of the block hashes (first 8 bytes) replica ``replica_id`` holds, from its
        KV events (``app.contract.kv_index``); expires when its subscriber stops."""
        return self.k("replica", replica_id, "kv", "blocks")

    def replica_kv_state(self, replica_id: object) -> str:
        """Hash of the KV-event subscriber's view of a replica: last seq, last event time,
        resyncs, stored/removed counts."""
        return self.k("replica", replica_id, "kv", "state")

    def kv_subscriber_lease(self, node: str) -> str:
        """Which worker process of ``node`` runs its KV-event subscriber (short TTL)."""
        return self.k("kv", "subscriber", node)

    def replica_supervisor(self, replica_id: object) -> str:
        return self.k("replica", replica_id, "supervisor")

    def replica_lock(self, replica_id: object) -> str:
        return self.k("replica", replica_id, "lock")

    def pool_lora_last(self, pool_id: object) -> str:
        return self.k("pool", pool_id, "lora", "last")

    # --- S01 cascade routers (control plane publishes, gateways compile) ------------
    def routers_version(self) -> str:
        return self.k("router", "version")

    def router_active(self, scope: str) -> str:
        return self.k("router", scope, "active")

    def router_train_queued(self, scope: str) -> str:
        return self.k("router", "train_queued", scope)

    # --- S00 cache -------------------------------------------------------------------
    def cache(self, *parts: object) -> str:
        """The cache store's keys (buckets, entries): ``<ns>:cache:...``."""
        return self.k("cache", *parts)

    def cache_served(self, request_id: str) -> str:
        """request_id of a cache hit -> the request whose answer it served (feedback
        on the hit evicts the source)."""
        return self.k("cache", "served", request_id)

    # --- S02 tool retrieval ------------------------------------------------------------
    def tool_memory(self, tenant_id: object, workflow: str) -> str:
        """Stream of one workflow's conversations, what they asked and the tools they
        called (``app.gateway.workflow_memory``); expires when the workflow goes quiet."""
        return self.k("tools", "memory", tenant_id, workflow)

    # --- template lint samples (gateways sample, the console reads) ------------------
    def lint_workflows(self) -> str:
        return self.k("lint", "workflows")

    def lint_requests(self, workflow: str, day: str) -> str:
        return self.k("lint", workflow, "n", day)

    def lint_samples(self, workflow: str) -> str:
        return self.k("lint", workflow, "samples")

    def celery_prefix(self) -> str:
        """Celery's broker and result keys (``global_keyprefix``)."""
        return self.k("celery", "")

    # --- sign-in throttling (app.auth.throttle) -----------------------------------------
    def auth_failures(self, kind: str, ident: str) -> str:
        """Failed sign-ins (or admin-token uses) of one account / client address."""
        return self.k("auth", "failures", kind, ident)

    def auth_lock(self, kind: str, ident: str) -> str:
        return self.k("auth", "lock", kind, ident)

    # --- control-plane bookkeeping ---------------------------------------------------
    def rollup_watermark(self) -> str:
        return self.k("finops", "rollup", "watermark")

    def rollup_ran_at(self) -> str:
        """Epoch seconds of the last rollup run: the FinOps figures are as of then."""
        return self.k("finops", "rollup", "ran_at")

    def drill_secret(self, ref: str) -> str:
        return self.k("drill", "secret", ref)

    def drill_namespace(self, run: str) -> str:
        """A scratch namespace for one drill run's keys."""
        return self.k("drill", run)
