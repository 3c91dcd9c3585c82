"""Provider credentials are named secrets, not arbitrary environment variables.

An external tier names the variable that holds its upstream API key (``api_key_env``);
only names in the declared namespace ``SLUICE_PROVIDER_KEY_<NAME>`` may be referenced.
The console refuses any other name when a tier is saved, and the gateway refuses it
again when it calls the upstream (a tier row written some other way still sends no
secret): a user who may edit tiers can never make the gateway send, say,
``SLUICE_SECRET_KEY`` or ``SLUICE_DATABASE_URL`` as a bearer token to a host of theirs.
"""
from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping

log = logging.getLogger(__name__)
PROVIDER_KEY_PREFIX = "SLUICE_PROVIDER_KEY_"
_NAME = re.compile(r"^SLUICE_PROVIDER_KEY_[A-Z0-9][A-Z0-9_]{0,63}$")


def is_provider_key_name(name: str) -> bool:
    return bool(_NAME.match(name or ""))


def provider_key(name: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The key in the variable ``name``, read now (a rotated key needs no snapshot).
    None when no name is set, the variable is unset, or the name is outside the
    namespace (logged: the tier is misconfigured and is called without a key)."""
    if not name:
        return None
    if not is_provider_key_name(name):
        log.error("refusing api_key_env %r: provider keys must be named %s<NAME>", name,
                  PROVIDER_KEY_PREFIX)
        return None
    return (os.environ if environ is None else environ).get(name) or None


# --- engines' own API keys ----------------------------------------------------------------
# One operator secret, in the environment of the node workers and the gateways (never in
# SQL or the snapshot): each pool's engines require a key derived from it and the pool id,
# so a key read off one node opens that pool only, and no key travels through Redis.
POOL_ENGINE_SECRET = "SLUICE_POOL_ENGINE_SECRET"


def pool_engine_key(pool_id: object, environ: Mapping[str, str] | None = None) -> str | None:
    """The bearer key pool ``pool_id``'s engines require (``--api-key``), or None when no
    ``SLUICE_POOL_ENGINE_SECRET`` is set (engines on the loopback need none)."""
    import hashlib
    import hmac
    secret = (os.environ if environ is None else environ).get(POOL_ENGINE_SECRET)
    if not secret or pool_id is None:
        return None
    return "sk-pool-" + hmac.new(secret.encode(), f"pool:{pool_id}".encode(),
                                 hashlib.sha256).hexdigest()[:48]
