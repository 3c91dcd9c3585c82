from celery import shared_task


@shared_task(name="router.train")
def train(scope: str) -> dict:
    """Train a router version for ``scope`` from its ledger traces; promote it if not worse."""
    from app.router.traces import train_from_ledger
    return train_from_ledger(scope)


@shared_task(name="router.schedule_training")
def schedule_training() -> list[str]:
    """Queue ``router.train`` for the scopes with enough new labels (beat, hourly)."""
    from app.router.schedule import enqueue_due_training
    return enqueue_due_training()


@shared_task(name="router.publish")
def publish() -> int:
    """Re-publish every scope's active router to Redis (after a Redis outage or flush)."""
    from app.router.service import publish_all
    return publish_all()
