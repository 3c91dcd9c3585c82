"""Tenant authentication against the snapshot's key hashes, and admission limits."""
from __future__ import annotations

import hashlib
import logging
import time

from app.contract.inflight import Lua
from app.contract.snapshot import Snapshot
from app.gateway.errors import GatewayError

log = logging.getLogger(__name__)


def authenticate(snapshot: Snapshot, authorization: str | None,
                 now: float | None = None) -> tuple[dict, dict]:
    """Return (tenant, key) for ``Authorization: Bearer <key>``.

    401 for a missing, unknown, revoked (absent from the snapshot) or expired key;
    403 for a key whose tenant is suspended.
    """
    if not authorization or not authorization[:7].lower() == "bearer ":
        raise GatewayError(401, "Missing API key: send 'Authorization: Bearer <key>'.",
                           code="missing_api_key")
    token = authorization[7:].strip()
    key = snapshot.keys.get(hashlib.sha256(token.encode()).hexdigest())
    if key is None:
        raise GatewayError(401, "Incorrect API key provided.", code="invalid_api_key")
    expires = key.get("expires_epoch")
    if expires is not None and expires <= (now if now is not None else time.time()):
        raise GatewayError(401, "This API key has expired.", code="expired_api_key")
    tenant = snapshot.tenant(key["tenant_id"])
    if tenant is None:
        raise GatewayError(401, "Incorrect API key provided.", code="invalid_api_key")
    if tenant.get("status") != "active":
        raise GatewayError(403, f"Tenant {tenant['name']!r} is {tenant.get('status')}.",
                           code="tenant_suspended")
    return tenant, key


# INCR + EXPIRE as one script call: it goes by the gateway's pipelined lane
# (``app.contract.redis_lane``), where a pipeline would take redis-py's pool.
_COUNT = Lua("local n = redis.call('INCR', KEYS[1]) "
             "redis.call('EXPIRE', KEYS[1], ARGV[1]) return n")


class RateLimiter:
    """Fixed one-minute window per tenant in Redis (INCR + EXPIRE in one round trip).

    Fails open: when Redis is unreachable the gateway keeps serving and skips the
    check for ``open_s`` seconds instead of paying a timeout per request.
    """

    def __init__(self, redis, keys, open_s: float = 2.0) -> None:
        self.redis = redis
        self.keys = keys
        self.open_s = open_s
        self._skip_until = 0.0

    async def check(self, tenant: dict) -> None:
        rpm = int(tenant["policy"]["rate_limit_rpm"])
        if rpm <= 0 or time.monotonic() < self._skip_until:
            return
        minute = int(time.time() // 60)
        key = self.keys.rate_limit(tenant["id"], minute)
        try:
            count = int(await _COUNT.acall(self.redis, [key], [120]))
        except Exception as exc:  # noqa: BLE001 - never refuse traffic because Redis is down
            log.warning("rate limiter unavailable, failing open: %s", exc)
            self._skip_until = time.monotonic() + self.open_s
            return
        if count > rpm:
            retry = 60 - int(time.time()) % 60
            raise GatewayError(429, f"Rate limit reached: {rpm} requests per minute.",
                               code="rate_limit_exceeded", headers={"retry-after": str(retry)})

