"""A real worker runs ``snapshot.publish`` against this session's database and Redis."""
import json

from app.redis_client import keys
from tests.factories import TenantFactory


def test_worker_publishes_a_snapshot_with_a_new_tenant(app, redis_client, celery_worker):
    tenant = TenantFactory(name="worker-visible")  # committed; no publish of its own
    k = keys()
    before = int(redis_client.get(k.snapshot_version()) or 0)
    app.extensions["celery"].send_task("snapshot.publish")

    version = celery_worker.wait_for(
        lambda: int(redis_client.get(k.snapshot_version()) or 0) > before
        and int(redis_client.get(k.snapshot_version())), what="snapshot version bump")
    snap = json.loads(redis_client.get(k.snapshot_data()))
    assert snap["version"] == version
    assert snap["tenants"][str(tenant.id)]["name"] == "worker-visible"
    celery_worker.wait_for(lambda: any(
        "snapshot.publish" in line and "succeeded" in line
        for line in celery_worker.log().splitlines()), what="task log line")
