from tests.gateway.conftest import world  # noqa: F401 (the gateway world fixture)
