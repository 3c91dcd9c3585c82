"""Sluice. The Flask app factory is ``app.factory.create_app``: importing ``app`` (the
gateway, the engine, the contract) loads no Flask. What each part may import is in
docs/architecture.md and guarded by tests/foundation/test_imports.py."""
