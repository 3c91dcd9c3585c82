"""The gateway process: ``gunicorn -k uvicorn.workers.UvicornWorker
'app.gateway.asgi:create_gateway()'``.

No SQL and no Flask app context here: the control plane's config arrives as the Redis
snapshot, polled in the background; ledger events leave through the Redis stream.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from typing import Any

import anyio
import redis
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Route

from app.core import minify_compact
from app.gateway import cache_verify, conformance, handlers, kv_route, traces
from app.gateway.auth import RateLimiter
from app.gateway.budget import BudgetGuard
from app.gateway.context import RequestContext
from app.gateway.ledger_writer import LedgerWriter
from app.gateway import shadow
from app.contract.snapshot import SnapshotStore
from app.gateway.stages import s00_cache
from app.gateway.telemetry import GatewayMetrics, finish
from app.gateway.upstream import Upstream
from app.gateway.workflow_memory import SharedWorkflowMemory, memory_client
from app.contract.routers import PublishedRouters
from app.contract.lint import LintSampler
from app.contract.inflight import DEFAULT_TTL_S, AsyncInflightTracker
from app.contract.keys import Keys
from app.contract import aredis, heap, leases

log = logging.getLogger(__name__)
STOP_TASKS_S = 3.0   # how long stop() waits for its cancelled background loops


class Gateway:
    """The long-lived parts of one gateway worker."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.keys = Keys(config["REDIS_NAMESPACE"])
        self.max_body = int(config["GATEWAY_MAX_BODY_BYTES"])
        self.poll_s = float(config["GATEWAY_SNAPSHOT_POLL_S"])
        self.metrics = GatewayMetrics()
        self.redis = None
        self.snapshots: SnapshotStore | None = None
        self.limiter: RateLimiter | None = None
        self.budget: BudgetGuard | None = None
        self.ledger: LedgerWriter | None = None
        self.upstream: Upstream | None = None
        self.cache = s00_cache.GatewayCache(config)
        self.routers = PublishedRouters()   # S01's active router per scope
        self._router_redis = None           # sync client: PublishedRouters.refresh is sync
        self.lint: LintSampler | None = None  # system-prompt samples for the template lint
        self.tool_memory: SharedWorkflowMemory | None = None  # S02's, shared through Redis
        self._tasks: list[asyncio.Task] = []
        self._stopping = False   # the background loops end at their next turn
        self._hooks: set[asyncio.Task] = set()

    async def start(self) -> None:
        self.redis = aredis.from_url(self.config["REDIS_URL"], socket_timeout=1.0,
                                     socket_connect_timeout=1.0)
        self.snapshots = SnapshotStore(self.redis, self.keys.snapshot_version(),
                                       self.keys.snapshot_data(), self.poll_s)
        self._preloaded: int | None = None    # snapshot version kv tokenizers were asked for
        self.limiter = RateLimiter(self.redis, self.keys)
        self.instance = leases.new_instance_id()
        self.heartbeat_s = float(self.config["GATEWAY_HEARTBEAT_S"])
        self.budget = BudgetGuard(self.redis, self.config["REDIS_NAMESPACE"],
                                  instance=self.instance,
                                  lease_s=float(self.config["GATEWAY_HOLD_LEASE_S"]))
        self.inflight = AsyncInflightTracker(self.redis, self.keys)
        self.ledger = LedgerWriter(
            self.redis, self.keys, self.metrics,
            spool_dir=self.config["GATEWAY_LEDGER_SPOOL_DIR"] or None,
            linger_s=float(self.config["GATEWAY_LEDGER_LINGER_S"]),
            max_backlog=int(self.config["GATEWAY_LEDGER_MAX_BACKLOG"]))
        self.upstream = Upstream(eject_s=float(self.config["GATEWAY_EJECT_S"]))
        self.lint = LintSampler(self.redis, self.keys,
                                float(self.config["GATEWAY_LINT_INTERVAL_S"]))
        self.tool_memory = SharedWorkflowMemory(memory_client(self.config["REDIS_URL"]),
                                                self.keys)
        await self.snapshots.refresh()
        self._router_redis = redis.Redis.from_url(self.config["REDIS_URL"], socket_timeout=1.0,
                                                  socket_connect_timeout=1.0)
        await self.refresh_routers()
        await self._beat()
        await self._reap()  # a gateway that died before this one left holds behind
        heap.settle("start")
        if self.config["GATEWAY_CACHE_WARM"]:
            threading.Thread(target=heap.then_settle(s00_cache.warm, "the embedding encoder"),
                             name="embedding-warm", daemon=True).start()
            threading.Thread(target=heap.then_settle(minify_compact.warm, "xgrammar"),
                             name="grammar-warm", daemon=True).start()
        self._tasks = [asyncio.create_task(self.snapshots.poll_forever(self._on_tick)),
                       asyncio.create_task(self.ledger.run()),
                       asyncio.create_task(self._refresh_inflight()),
                       asyncio.create_task(self._flush_lint()),
                       asyncio.create_task(self._heartbeat())]

    async def _beat(self) -> None:
        """Renew this instance's lease and settle what Redis refused earlier."""
        try:
            await self.budget.heartbeat(self.heartbeat_s)
            if self.budget.unsettled:
                await self.budget.retry_unsettled()
        except Exception as exc:  # noqa: BLE001 - Redis out: the next beat tries again
            log.warning("gateway heartbeat failed (%d settles waiting): %s",
                        len(self.budget.unsettled), exc)

    async def _heartbeat(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self.heartbeat_s)
            if not self._stopping:   # a stopping instance's lease ends; never renew it
                await self._beat()
                heap.settle_if_grown()

    async def _reap(self, instances: list[str] | None = None) -> None:
        """Give back the budget holds of dead gateway instances (``leases.reap``)."""
        try:
            out = await anyio.to_thread.run_sync(
                lambda: leases.reap(self._router_redis, self.keys, instances=instances))
            if out["holds"]:
                log.warning("gave back %d budget holds (%d micro-USD) of %d dead gateway "
                            "instances", out["holds"], out["micro"], out["instances"])
        except Exception as exc:  # noqa: BLE001 - the Celery beat reaper runs too
            log.warning("budget hold reaper failed: %s", exc)

    async def refresh_routers(self) -> None:
        """Reload the published routers when their version moved (one GET otherwise);
        on failure the routers in hand stay in service."""
        try:
            await anyio.to_thread.run_sync(self.routers.refresh, self._router_redis,
                                           self.keys.ns)
        except Exception as exc:  # noqa: BLE001 - S01 keeps the last routers
            log.warning("router refresh failed: %s", exc)

    async def _on_tick(self) -> None:
        snap = self.snapshots.current
        if snap is not None:
            self.metrics.snapshot_version.set(snap.version)
            if snap.version != self._preloaded:
                self._preloaded = snap.version
                try:
                    kv_route.preload(snap)
                except Exception as exc:  # noqa: BLE001 - the first request loads it then
                    log.warning("kv_events tokenizer preload failed: %s", exc)
        await self.refresh_routers()
        if self.ledger.queue:
            self.ledger._wake.set()

    async def _refresh_inflight(self) -> None:
        """Keep this process's in-flight counts alive for readers (they expire after
        the tracker's TTL, so a crashed gateway's load disappears)."""
        while not self._stopping:
            await asyncio.sleep(DEFAULT_TTL_S / 3)
            if self.inflight.local:
                try:
                    await self.inflight.refresh()
                except Exception as exc:  # noqa: BLE001
                    log.warning("in-flight refresh failed: %s", exc)

    async def _flush_lint(self) -> None:
        """Write the lint's request counts of workflows that went quiet."""
        while not self._stopping:
            await asyncio.sleep(self.lint.interval_s)
            await self._lint_write(self.lint.flush())

    @staticmethod
    async def _lint_write(write) -> None:
        try:
            await write
        except Exception as exc:  # noqa: BLE001 - the lint is advisory
            log.debug("lint sample not written: %s", exc)

    def _sample_prompt(self, ctx: RequestContext) -> None:
        """A request that reached a model: count it for the template lint (its workflow's
        system prompt costs prefill there); now and then keep the prompt, after the answer."""
        if ctx.cache != "miss" or ctx.tier is None or self.lint is None:
            return
        write = self.lint.note(ctx.tenant["id"], ctx.workflow_signature, ctx.body)
        if write is not None:
            self.spawn(self._lint_write(write))

    async def track_replica(self, ctx: RequestContext, replica_id) -> None:
        """Count ``ctx`` in flight on ``replica_id`` (releasing a previous replica of a
        failover); ``book`` releases it. Redis out: counted locally, written later."""
        await self.untrack_replica(ctx)
        if replica_id is None:
            return
        ctx.inflight_replica = replica_id
        plan = ctx.kv_unmatched    # S03's prefill estimate holds for its own choice only
        ctx.inflight_pending = plan[1] if plan is not None and plan[0] == replica_id else 0
        try:
            await self.inflight.acquire(replica_id, ctx.inflight_pending)
        except Exception as exc:  # noqa: BLE001 - load is advisory
            log.debug("in-flight acquire failed: %s", exc)

    def prefilled(self, ctx: RequestContext) -> None:
        if ctx.inflight_pending and ctx.inflight_replica is not None:
            self.inflight.prefilled(ctx.inflight_replica, ctx.inflight_pending)
        ctx.inflight_pending = 0

    async def untrack_replica(self, ctx: RequestContext) -> None:
        rid, ctx.inflight_replica = ctx.inflight_replica, None
        if rid is None:
            return
        pending, ctx.inflight_pending = ctx.inflight_pending, 0
        try:
            await self.inflight.release(rid, pending)
        except Exception as exc:  # noqa: BLE001
            log.debug("in-flight release failed: %s", exc)

    async def stop(self) -> None:
        self._stopping = True
        for t in self._tasks:
            t.cancel()
        # Bounded: a loop whose cancellation was swallowed below it (seen on the heartbeat's
        # Redis pipeline under load: the task sat "cancelling" in its next sleep for good)
        # must not keep the ledger from being flushed and the spool from being closed.
        _, stuck = await asyncio.wait(self._tasks, timeout=STOP_TASKS_S) \
            if self._tasks else (None, set())
        if stuck:
            log.warning("gateway stopping: %d background task(s) did not end on cancel: %s",
                        len(stuck), sorted(t.get_coro().__qualname__ for t in stuck))
        if self._hooks:
            await asyncio.wait(self._hooks, timeout=5)
        with contextlib.suppress(Exception):  # this instance is gone: its lease ends now
            await self.budget.retry_unsettled()
            await self.redis.delete(self.keys.gateway_alive(self.instance))
            await self._reap([self.instance])
        if self.lint is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.lint.flush(), timeout=2)
        try:
            await asyncio.wait_for(self.ledger.flush(), timeout=5)
        except Exception as exc:  # noqa: BLE001
            log.error("gateway stopping with %d ledger events unwritten (left in its spool "
                      "for the next gateway): %s", len(self.ledger.queue), exc)
        self.ledger.close()
        await self.upstream.aclose()
        await self.redis.aclose()
        lane = aredis.lane_of(self.redis)
        if lane is not None:
            lane.close()
        if self._router_redis is not None:
            self._router_redis.close()
        if self.tool_memory is not None:
            self.tool_memory.redis.close()
        self.cache.close()

    def book(self, ctx: RequestContext) -> None:
        """Account a finished request: metrics now, ledger event to the stream, and the
        budget hold settled at the cost the ledger records (0 for failures and hits)."""
        try:
            self.ledger.submit(finish(ctx, self.metrics))
        except Exception:  # noqa: BLE001 - accounting bugs must not fail the answer
            log.exception("request %s: telemetry failed", ctx.request_id)
        try:
            self._sample_prompt(ctx)
        except Exception:  # noqa: BLE001 - the lint never fails the answer
            log.exception("request %s: lint sample failed", ctx.request_id)
        traces.offer(ctx, self.spawn)  # a frontier answer the LoRA flywheel may learn from
        shadow.offer(ctx, self.spawn, self.ledger.submit)  # an adapter in shadow, off the path
        cache_verify.offer(ctx, self.spawn, self.ledger.submit)  # a sampled hit, again upstream
        if ctx.inflight_replica is not None:
            self.spawn(self.untrack_replica(ctx))
        if ctx.budget_reserved is not None:
            actual = ctx.telemetry.get("cost_usd") or 0
            reserved, ctx.budget_reserved = ctx.budget_reserved, None
            self.spawn(self.budget.settle(ctx.tenant["id"], reserved, actual,
                                          ctx.budget_period, ctx.request_id,
                                          hold_id=ctx.request_id))

    async def release_budget(self, ctx: RequestContext) -> None:
        """Settle the hold now at cost 0 (a cache hit)."""
        if ctx.budget_reserved is not None:
            reserved, ctx.budget_reserved = ctx.budget_reserved, None
            await self.budget.settle(ctx.tenant["id"], reserved, 0, ctx.budget_period,
                                     hold_id=ctx.request_id)

    def spawn(self, coro) -> None:
        """Run ``coro`` after the answer; ``stop`` waits for it."""
        task = asyncio.get_running_loop().create_task(coro)
        self._hooks.add(task)
        task.add_done_callback(self._hooks.discard)

    def book_stream(self, ctx: RequestContext) -> None:
        ctx.telemetry["booked"] = True
        self.metrics.in_flight.dec()
        self.book(ctx)
        if ctx.status == 200:
            self.spawn(self._after(ctx))

    @staticmethod
    async def _after(ctx: RequestContext) -> None:
        try:
            await s00_cache.on_complete(ctx, ctx.collected)
        except Exception:  # noqa: BLE001
            log.exception("request %s: cache on_complete failed", ctx.request_id)


def create_gateway(config: dict[str, Any] | None = None) -> Starlette:
    if config is None:
        from config import load_config
        config = load_config()
    gw = Gateway(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        await gw.start()
        try:
            yield
        finally:
            await gw.stop()

    app = Starlette(routes=[
        Route("/v1/chat/completions", handlers.chat_completions, methods=["POST"]),
        Route("/v1/models", handlers.list_models, methods=["GET"]),
        Route("/v1/feedback", handlers.feedback, methods=["POST"]),
        Route("/metrics", handlers.metrics, methods=["GET"]),
        Route("/healthz", handlers.healthz, methods=["GET"]),
    ], lifespan=lifespan, middleware=[Middleware(conformance.RequestIdMiddleware)],
        exception_handlers=conformance.EXCEPTION_HANDLERS)
    app.state.gw = gw
    return app
