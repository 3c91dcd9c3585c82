"""The ``ledger.drain`` Celery task, run by a real worker."""
from __future__ import annotations

import orjson

from app.extensions import db
from app.ledger.models import LedgerEntry
from app.redis_client import keys
from tests.factories import TenantFactory
from tests.ledger.test_drain import event


def test_worker_drains_the_stream(app, redis_client, celery_worker):
    t = TenantFactory()
    for i in range(7):
        redis_client.xadd(keys().ledger_stream(), {"e": orjson.dumps(event(t.id, i))})
    app.extensions["celery"].send_task("ledger.drain", kwargs={"max_batches": 5})

    def rows() -> int:
        db.session.expire_all()
        return db.session.scalar(db.select(db.func.count()).select_from(LedgerEntry).where(
            LedgerEntry.tenant_id == t.id))
    assert celery_worker.wait_for(lambda: rows() == 7, what="7 ledger rows") is True
