"""Audited invalidation from the console/API service."""
import pytest

from app.audit.models import AuditLog
from app.contract.cache.embedding import embed
from app.contract.cache.keys import build_key
from app.cache.service import get_store, invalidate_cache
from app.errors import Forbidden
from app.extensions import db
from app.contract.policy import DEFAULTS
from tests.factories import TenantFactory, UserFactory


def _put(tenant_id, text):
    key = build_key(tenant_id, DEFAULTS, "auto", {"temperature": 0,
                                                  "messages": [{"role": "user", "content": text}]})
    get_store().store(key, embed(key.text), {"choices": [{"index": 0, "finish_reason": "stop",
                      "message": {"role": "assistant", "content": "x"}}]}, f"r-{tenant_id}", 60)
    return key


def test_invalidate_is_permissioned_scoped_and_audited(app):
    a, b = TenantFactory(), TenantFactory()
    ka, kb = _put(str(a.id), "Warranty for SKU-1"), _put(str(b.id), "Warranty for SKU-1")
    own = UserFactory(role="admin")
    tenant_user = UserFactory(role="viewer", tenant=a)
    with pytest.raises(Forbidden):
        invalidate_cache(tenant_user, tenant_id=a.id)
    assert invalidate_cache(own, tenant_id=a.id) == 1
    assert get_store().lookup(ka, None, 0.965) is None
    assert get_store().lookup(kb, None, 0.965) is not None
    row = db.session.scalars(db.select(AuditLog).where(AuditLog.action == "cache.invalidate")).one()
    assert row.tenant_id == a.id and row.after["removed"] == 1
    invalidate_cache(own)
    assert get_store().lookup(kb, None, 0.965) is None
