"""S03 prefix-aware replica choice (control-plane side): the simulator's workload and
recorded runs, live multi-turn loads, the template lint, its console page (``/routing``),
CLI (``flask sim ...``) and drill CD-28C (replica loss). The cascade router (S01) is
``app.cascade``."""
