"""factory_boy factories for the control plane's models."""
from __future__ import annotations

from decimal import Decimal

import factory
from factory.alchemy import SQLAlchemyModelFactory

from app.auth.models import User
from app.catalog.models import Pool, Replica, Tier
from app.extensions import db
from app.policies.models import Policy
from app.security import KEY_PREFIX, hash_password, new_token
from app.tenants.models import ApiKey, Tenant

PASSWORD = "Correct-Horse-9"
_HASH = None


def _password_hash() -> str:
    global _HASH
    if _HASH is None:
        _HASH = hash_password(PASSWORD)  # argon2 is slow on purpose; hash once
    return _HASH


class Base(SQLAlchemyModelFactory):
    class Meta:
        abstract = True
        sqlalchemy_session_factory = lambda: db.session  # noqa: E731
        sqlalchemy_session_persistence = "commit"


class TenantFactory(Base):
    class Meta:
        model = Tenant

    name = factory.Sequence(lambda n: f"tenant-{n}")
    department = factory.Sequence(lambda n: f"dept-{n}")
    status = "active"


class UserFactory(Base):
    class Meta:
        model = User

    email = factory.Sequence(lambda n: f"user{n}@example.com")
    role = "viewer"
    tenant = None
    password_hash = factory.LazyFunction(_password_hash)


class PoolFactory(Base):
    class Meta:
        model = Pool

    name = factory.Sequence(lambda n: f"pool-{n}")
    node = "local"
    engine = "reference"
    model = "tiny"
    desired_replicas = 1
    options = factory.LazyFunction(dict)


class TierFactory(Base):
    class Meta:
        model = Tier

    name = factory.Sequence(lambda n: f"tier-{n + 1}")
    rank = factory.Sequence(lambda n: n + 1)
    model = "tiny"
    price_input_per_m = Decimal("1")
    price_cached_input_per_m = Decimal("0.25")
    price_output_per_m = Decimal("3")
    upstream_kind = "external"
    endpoint_url = "http://127.0.0.1:9/v1"


def make_key(tenant: Tenant, name: str = "k") -> tuple[ApiKey, str]:
    """A usable gateway key for ``tenant``; returns (row, plaintext)."""
    plaintext, prefix, digest = new_token(KEY_PREFIX)
    key = ApiKey(tenant_id=tenant.id, name=name, prefix=prefix, key_hash=digest)
    db.session.add(key)
    db.session.commit()
    return key, plaintext


def kv_events_pool(tenant: Tenant, name: str) -> tuple[Replica, Replica]:
    """``tenant`` on ``replica_choice: kv_events`` and a reference pool ``name`` with KV
    events on and two healthy replicas (index 0 and 1), committed: the Routing page's
    kv section."""
    db.session.add(Policy(tenant_id=tenant.id, values={"replica_choice": "kv_events"}))
    pool = Pool(name=name, model="tiny", served_model_name="tiny", engine="reference",
                options={"kv_events": True})
    db.session.add(pool)
    db.session.flush()
    reps = (Replica(pool_id=pool.id, index=0, url="http://127.0.0.1:9", state="healthy"),
            Replica(pool_id=pool.id, index=1, url="http://127.0.0.1:10", state="healthy"))
    db.session.add_all(reps)
    db.session.commit()
    return reps
