"""Budget holds as leases (app.contract.leases): the reserved counter equals the live
holds at every step; the reaper (the Celery beat task's function) gives back a dead
instance's holds and a live one's expired hold; a settle after the reaper, or a settle
retried after a lost reply, never takes a hold off twice nor counts spend twice."""
from __future__ import annotations

import asyncio
import time
from decimal import Decimal

import redis.asyncio as aioredis

from app.contract import budget as rb
from app.contract import leases
from app.redis_client import keys
from tests.conftest import REDIS_URL
from tests.robustness.faults import report

PERIOD = "2031-05"


def test_reaper_returns_dead_and_expired_holds_and_nothing_twice(app, redis_client):
    from workers.tasks.finops import reap_holds
    r, k, tid = redis_client, keys(), 4242
    ns = k.ns
    reserved = rb.reserved_key(ns, tid, PERIOD)

    def hold(inst, rid, lease_s=900.0):
        return rb.Hold(k.budget_holds(inst), rid, lease_s)

    def invariant() -> int:
        counter = int(r.get(reserved) or 0)
        assert counter == leases.live_holds(r, k).get(reserved, 0)
        return counter

    pipe = r.pipeline()
    for inst in ("alive", "dead"):
        leases.heartbeat_commands(pipe, k, inst, 60)
    pipe.execute()
    for i in range(3):
        assert rb.reserve(r, ns, tid, Decimal("0.50"), PERIOD, hold=hold("alive", f"a{i}"))[0]
        assert rb.reserve(r, ns, tid, Decimal("0.25"), PERIOD, hold=hold("dead", f"d{i}"))[0]
    assert rb.reserve(r, ns, tid, Decimal("0.10"), PERIOD, hold=hold("alive", "short", 0))[0]
    at_start = invariant()
    r.delete(k.gateway_alive("dead"))               # killed: its heartbeat expires
    out = reap_holds()                              # what Celery beat runs every 15 s
    after_reap = invariant()
    # the dead instance's in-flight request settles late: no second decrement, spend counted
    rb.settle(r, ns, tid, Decimal("0.25"), Decimal("0.20"), PERIOD, hold=hold("dead", "d0"))
    after_late = invariant()
    rb.settle(r, ns, tid, Decimal("0.50"), Decimal("0.40"), PERIOD, hold=hold("alive", "a0"))

    async def retried():  # the reply of a settle was lost: the gateway sends it again
        client = aioredis.Redis.from_url(REDIS_URL)
        await rb.asettle(client, ns, tid, Decimal("0.50"), Decimal("0.40"), PERIOD,
                         hold=hold("alive", "a0"), retry=True)
        await client.aclose()
    asyncio.run(retried())
    spent = rb.state(r, ns, tid, PERIOD)["spent_micro"]
    final = leases.reap(r, k, now=time.time() + 1000)   # every remaining lease expired
    report("budget hold leases", reserved_micro_start=at_start, reaped=out,
           reserved_micro_after_reap=after_reap, after_late_settle=after_late,
           spent_micro=spent, reserved_micro_end=invariant(), last_reap=final)
    assert at_start == 3 * 500_000 + 3 * 250_000 + 100_000
    # a0-a2 left; "short" expired (other tests' killed gateways may add to out["holds"])
    assert out["holds"] >= 4 and after_reap == 3 * 500_000
    assert after_late == after_reap
    assert spent == 200_000 + 400_000, "the retried settle counted nothing twice"
    assert final["holds"] == 2 and int(r.get(reserved)) == 0
    assert not r.sismember(k.gateway_instances(), "dead")
    for key in (reserved, rb.spent_key(ns, tid, PERIOD), k.budget_holds("alive"),
                k.gateway_alive("alive")):
        r.delete(key)
    r.srem(k.gateway_instances(), "alive")


def test_a_reserve_whose_reply_was_lost_gives_its_hold_back(app, redis_client):
    """Redis ran the reserve script but the gateway never saw the reply (Redis killed or
    cut off right after it; with an append-only file the hold survives a restart): the
    gateway fails open, and its retried settles give the hold back, once. A reserve that
    never ran leaves nothing to give back, and its retry takes nothing off another hold."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    from app.gateway.budget import BudgetGuard
    r, k, tid = redis_client, keys(), 4343
    ns = k.ns
    period = rb.current_period()
    reserved = rb.reserved_key(ns, tid, period)
    pipe = r.pipeline()
    leases.heartbeat_commands(pipe, k, "lost-reply", 60)   # a live gateway instance
    pipe.execute()

    class ReplyLost:
        """The network between the gateway and Redis: the command reaches Redis (or not),
        the reply never comes back."""
        def __init__(self, client, runs: bool) -> None:
            self.client, self.runs = client, runs

        async def evalsha(self, *args):
            if self.runs:
                await self.client.evalsha(*args)
            raise RedisConnectionError("Connection closed by server.")

    async def go() -> tuple[int, int, int, int]:
        client = aioredis.Redis.from_url(REDIS_URL)
        try:
            guard = BudgetGuard(client, ns, instance="lost-reply")
            guard.redis = ReplyLost(client, runs=True)
            held, _ = await guard.reserve(tid, Decimal("0.30"), request_id="r-lost")
            after_lost = int(r.get(reserved) or 0)        # Redis holds it; the gateway not
            guard._skip_until = 0.0
            guard.redis = ReplyLost(client, runs=False)   # this one never reached Redis
            await guard.reserve(tid, Decimal("0.20"), request_id="r-never")
            other = BudgetGuard(client, ns, instance="lost-reply")
            assert (await other.reserve(tid, Decimal("0.05"), request_id="r-ok"))[0]
            guard.redis = client                          # Redis answers again
            queued = len(guard.unsettled)
            await guard.retry_unsettled()
            await guard.retry_unsettled()                 # nothing left: nothing twice
            assert held is None
            return after_lost, queued, int(r.get(reserved) or 0), len(guard.unsettled)
        finally:
            await client.aclose()
    after_lost, queued, after_retry, left = asyncio.run(go())
    live = leases.live_holds(r, k).get(reserved, 0)
    report("reserve reply lost", reserved_micro_after_lost=after_lost, queued=queued,
           reserved_micro_after_retry=after_retry, live_holds_micro=live)
    assert after_lost == 300_000
    assert queued == 2 and left == 0
    assert after_retry == live == 50_000, "only the hold whose reply was lost went back"
    assert rb.state(r, ns, tid, period)["spent_micro"] == 0
    for key in (reserved, rb.spent_key(ns, tid, period), k.budget_holds("lost-reply"),
                k.gateway_alive("lost-reply")):
        r.delete(key)
    r.srem(k.gateway_instances(), "lost-reply")
