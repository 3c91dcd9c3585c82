"""Tasks of the S01 cascade router (``app.cascade``). Their names keep the ``router.``
prefix: the beat schedule and queued messages use them."""
from celery import shared_task


@shared_task(name="router.train")
def train(scope: str) -> dict:
    """Train a router version for ``scope`` from its ledger traces; promote it if not worse."""
    from app.cascade.traces import train_from_ledger
    return train_from_ledger(scope)


@shared_task(name="router.schedule_training")
def schedule_training() -> list[str]:
    """Queue ``router.train`` for the scopes with enough new labels (beat, hourly)."""
    from app.cascade.schedule import enqueue_due_training
    return enqueue_due_training()


@shared_task(name="router.publish")
def publish() -> int:
    """Re-publish every scope's active router to Redis (after a Redis outage or flush)."""
    from app.cascade.service import publish_all
    return publish_all()
