"""Tasks of the LoRA flywheel (``app.adapters``)."""
from celery import shared_task


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
