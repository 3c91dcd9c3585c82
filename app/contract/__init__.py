"""The contract between the control plane and the data plane.

Everything both planes must agree on lives here, Flask- and SQL-free: the Redis keyspace
(``keys``), the typed config snapshot (``snapshot``), the policy with its defaults
(``policy``), the ledger and feedback events (``events``), and the Redis-side runtimes
both planes run (``budget`` counters, ``inflight`` replica loads, published cascade
``routers``, the template ``lint`` samples, the S00 ``cache`` store and embeddings,
``tokenizers``). The gateway, the engine and node-side workers import only this package,
``app.core`` and ``config``; tests/foundation/test_imports.py guards the rule.
"""
