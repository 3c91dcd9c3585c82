"""S01 cascade router (control-plane side): training traces from the ledger, fitting and
held-out evaluation, versions and publishing to the gateway, its console pages (``/router``),
admin API (``/api/v1/router``), CLI (``flask router ...``), Celery tasks (``router.*``) and
drill CD-28B (domain shift). Replica choice (S03) is ``app.replica_routing``."""
