"""Tasks of the LoRA flywheel (``app.adapters``)."""
from celery import shared_task


@shared_task(name="adapters.train")
def train(adapter_id: int) -> dict:
    """Train, store and evaluate an adapter, then make it a candidate (queue
    ADAPTERS_TRAIN_QUEUE; safe to run again after a worker died)."""
    from app.adapters.training import train_adapter
    return train_adapter(adapter_id)


@shared_task(name="adapters.drain_traces")
def drain_traces(max_batches: int = 20) -> int:
    """Move the gateway's trace stream into adapter_traces; returns traces written."""
    from app.adapters.traces import drain_traces as drain
    return drain(max_batches=max_batches)


# --- serving (node queue pool.<node>: sent by app.adapters.rollout) and the shadow gate ---
@shared_task(name="adapters.load", ignore_result=False)
def load(adapter_id: int) -> dict:
    """Hot-load the adapter on its pool's replicas; {replica id: "ok" | error}."""
    from app.adapters.node import load_adapter
    return load_adapter(adapter_id)


@shared_task(name="adapters.unload", ignore_result=False)
def unload(adapter_id: int) -> dict:
    from app.adapters.node import unload_adapter
    return unload_adapter(adapter_id)


@shared_task(name="adapters.shadow_rollup")
def shadow_rollup() -> list:
    """Shadow concordance per adapter in shadow; submits those that met the gate."""
    from app.adapters.serving import shadow_rollup as run
    return run()


@shared_task(name="adapters.canary_watch")
def canary_watch() -> list:
    """Live error / pass rates per serving adapter; rolls back those that regressed."""
    from app.adapters.watch import canary_watch as run
    return run()
