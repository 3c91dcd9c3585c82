from celery import shared_task


@shared_task(name="snapshot.publish")
def publish() -> int:
    """Rebuild and publish the gateway config snapshot; returns its version."""
    from app.snapshot.service import publish as _publish
    return _publish()
