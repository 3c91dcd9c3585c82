"""Budget holds on the request path: reserve an estimate at admission, settle the actual
cost when the request is booked (``app.contract.budget`` does the Redis side).

Fails open like the rate limiter: with Redis unreachable the gateway serves and skips
the check for ``open_s`` seconds; the ledger reconcile later corrects the counters.
"""
from __future__ import annotations

import logging
import math
import time
from collections import deque
from decimal import Decimal

import orjson

from app.core.pricing import prices_at
from app.contract import budget as rb
from app.contract import leases
from app.contract.keys import Keys
from app.gateway.errors import GatewayError

log = logging.getLogger(__name__)
MILLION = Decimal(1_000_000)
CHARS_PER_TOKEN = 4


def _text_len(content) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(p.get("text") or "") for p in content if isinstance(p, dict))
    return 0


def estimate_prompt_tokens(body: dict) -> int:
    """Prompt tokens from text length (about 4 characters a token, rounded up), plus a
    few per message for the chat template; tools and the schema count as their JSON."""
    chars = sum(_text_len(m.get("content")) for m in body.get("messages") or [])
    for extra in ("tools", "response_format"):
        if body.get(extra):
            chars += len(orjson.dumps(body[extra]))
    return math.ceil(chars / CHARS_PER_TOKEN) + 4 * len(body.get("messages") or [])


def reachable_tiers(allowed: list[dict], requested: dict | None) -> list[dict]:
    """Tiers a request may end on: for ``auto`` any allowed tier; for a named tier that
    one and the allowed tiers above it (escalation)."""
    if requested is None:
        return allowed
    return [t for t in allowed if t["rank"] >= requested["rank"]] or [requested]


def estimate_usd(body: dict, tiers: list[dict], max_tokens_cap: int) -> Decimal:
    """Worst case over ``tiers``: prompt estimate x input price + max_tokens x output."""
    prompt = estimate_prompt_tokens(body)
    out = body.get("max_tokens") or body.get("max_completion_tokens") or max_tokens_cap
    out = min(int(out), max_tokens_cap) * int(body.get("n") or 1)
    worst = Decimal(0)
    for t in tiers:
        prices = prices_at(t)  # the price in force now (effective-dated schedule)
        cost = (prompt * Decimal(str(prices.get("price_input_per_m") or 0))
                + out * Decimal(str(prices.get("price_output_per_m") or 0))) / MILLION
        worst = max(worst, cost)
    return worst


class BudgetGuard:
    """Holds are leases of this gateway instance (``app.contract.leases``): recorded with
    the instance id and a deadline by the reserve script, so a reaper can give back the
    holds of a gateway that died. A settle that Redis refused is kept and retried by the
    heartbeat, so an outage does not leave holds (or spend) behind."""

    def __init__(self, redis, ns: str, open_s: float = 2.0, *, instance: str | None = None,
                 lease_s: float = 900.0, keep_unsettled: int = 100_000) -> None:
        self.redis = redis
        self.ns = ns
        self.open_s = open_s
        self._skip_until = 0.0
        self.keys = Keys(ns)
        self.instance = instance
        self.holds_key = self.keys.budget_holds(instance) if instance else None
        self.lease_s = lease_s
        self.unsettled: deque[tuple] = deque(maxlen=keep_unsettled)

    def _hold(self, request_id: str | None) -> rb.Hold | None:
        if self.holds_key is None or not request_id:
            return None
        return rb.Hold(self.holds_key, request_id, self.lease_s)

    async def reserve(self, tenant_id: int, estimate: Decimal,
                      request_id: str | None = None) -> tuple[Decimal | None, str]:
        """Hold ``estimate`` for the month; returns (held amount or None when Redis is
        out, period). Raises the 429 when a hard budget refuses it."""
        period = rb.current_period()
        if time.monotonic() < self._skip_until:
            return None, period
        hold = self._hold(request_id)
        try:
            ok, reason = await rb.areserve(self.redis, self.ns, tenant_id, estimate,
                                           period=period, hold=hold)
        except Exception as exc:  # noqa: BLE001 - never refuse traffic because Redis is down
            log.warning("budget counters unavailable, failing open: %s", exc)
            self._skip_until = time.monotonic() + self.open_s
            if hold is not None:
                # the script may have run with its reply lost (Redis killed or cut off right
                # after it; an append-only file keeps it across a restart): give the hold
                # back with the retried settles, applied only if the hold is there
                self.unsettled.append((tenant_id, estimate, Decimal(0), period, None,
                                       request_id))
            return None, period
        if not ok:
            body = rb.error_body(reason)["error"]
            # A spent budget stays spent until the month turns or someone raises it: tell
            # OpenAI's SDKs not to retry the 429 (they would, three times by default).
            raise GatewayError(429, body["message"], code=body["code"], type_=body["type"],
                               headers={"x-should-retry": "false"})
        return estimate, period

    async def settle(self, tenant_id: int, reserved: Decimal | None, actual: Decimal,
                     period: str, request_id: str | None = None, *,
                     hold_id: str | None = None) -> None:
        """``request_id``: the ledger row's, when the request is booked (lets the
        reconcile tell a not-yet-drained count from drift); ``hold_id``: the request id
        the hold was reserved under."""
        if reserved is None:
            return
        args = (tenant_id, reserved, actual, period, request_id, hold_id)
        try:
            await self._settle(*args)
        except Exception as exc:  # noqa: BLE001 - kept and retried by the heartbeat
            self.unsettled.append(args)
            log.warning("budget settle failed for tenant %s (reserved %s, actual %s), will "
                        "retry: %s", tenant_id, reserved, actual, exc)

    async def _settle(self, tenant_id, reserved, actual, period, request_id, hold_id,
                      retry: bool = False) -> None:
        await rb.asettle(self.redis, self.ns, tenant_id, reserved, actual, period=period,
                         request_id=request_id, hold=self._hold(hold_id), retry=retry)

    async def retry_unsettled(self) -> int:
        """Settle what Redis refused earlier (idempotent per hold); returns how many
        went through. Stops at the first failure (Redis still out)."""
        done = 0
        while self.unsettled:
            await self._settle(*self.unsettled[0], retry=True)
            self.unsettled.popleft()
            done += 1
        return done

    async def heartbeat(self, interval_s: float) -> None:
        """Renew this instance's lease (one pipelined round trip)."""
        pipe = self.redis.pipeline(transaction=False)
        leases.heartbeat_commands(pipe, self.keys, self.instance, interval_s)
        await pipe.execute()
