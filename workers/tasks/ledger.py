from celery import shared_task


@shared_task(name="ledger.drain")
def drain(max_batches: int = 20, batch_size: int | None = None) -> int:
    """Move ledger events from the Redis stream into SQL; returns rows written."""
    from app.ledger.service import drain_stream
    return drain_stream(max_batches=max_batches, batch_size=batch_size)
