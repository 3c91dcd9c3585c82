"""Celery bound to the Flask app per Flask's pattern: tasks run inside the app context.

``workers/celery_app.py`` builds the app and hands Celery's CLI this instance."""
from __future__ import annotations

from celery import Celery, Task
from flask import Flask

from app.contract.keys import Keys


def celery_init_app(app: Flask) -> Celery:
    class FlaskTask(Task):
        def __call__(self, *args, **kwargs):
            with app.app_context():
                return self.run(*args, **kwargs)

    prefix = Keys(app.config["REDIS_NAMESPACE"]).celery_prefix()
    settings = {
        "broker_url": app.config["REDIS_URL"],
        "result_backend": app.config["REDIS_URL"],
        "task_ignore_result": True,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "broker_connection_retry_on_startup": True,
        # Keys and queues under our namespace, so parallel deployments/tests don't mix.
        "broker_transport_options": {"global_keyprefix": prefix},
        "result_backend_transport_options": {"global_keyprefix": prefix},
        "task_default_queue": "default",
        "beat_schedule": {
            "snapshot-publish": {"task": "snapshot.publish", "schedule": 60.0},
            "ledger-drain": {"task": "ledger.drain", "schedule": 2.0},
            "finops-rollup": {"task": "finops.rollup", "schedule": 300.0},
            "finops-check-budgets": {"task": "finops.check_budgets", "schedule": 60.0},
            "finops-reconcile-budgets": {"task": "finops.reconcile_budgets", "schedule": 900.0},
            "finops-reset-budgets": {"task": "finops.reset_budgets", "schedule": 3600.0},
            "finops-reap-holds": {"task": "finops.reap_holds", "schedule": 15.0},
            "router-schedule-training": {"task": "router.schedule_training", "schedule": 3600.0},
            # Fan out to each node's queue pool.<node>; run workers there with
            # ``-Q pool.<node>`` (SLUICE_NODE names the node).
            "pools-supervise": {"task": "pools.supervise", "schedule": 5.0},
            "pools-scrape": {"task": "pools.scrape", "schedule": 10.0},
            # KV-event subscriber per node (replica_choice kv_events): started or handed
            # the node's healthy replicas
            "pools-kv-index": {"task": "pools.kv_index", "schedule": 5.0},
            "adapters-shadow-rollup": {"task": "adapters.shadow_rollup", "schedule": 30.0},
            "adapters-canary-watch": {"task": "adapters.canary_watch", "schedule": 30.0},
            "adapters-drain-traces": {"task": "adapters.drain_traces", "schedule": 5.0},
        },
        "imports": ["workers.tasks.snapshot", "workers.tasks.ledger", "workers.tasks.cascade",
                    "workers.tasks.pools", "workers.tasks.finops", "workers.tasks.drills",
                    "workers.tasks.adapters"],
    }
    settings.update(app.config["CELERY"])
    celery = Celery(app.name, task_cls=FlaskTask)
    celery.config_from_object(settings)
    celery.set_default()
    app.extensions["celery"] = celery
    return celery
