import pytest

from tests.console.web import browser, login
from tests.factories import TenantFactory, UserFactory


@pytest.fixture()
def client(app):
    return browser(app)


@pytest.fixture()
def as_role(client):
    """Sign in a fresh user with ``role`` (optionally scoped to ``tenant``); returns it."""
    def sign_in(role: str, tenant=None):
        user = UserFactory(role=role, tenant=tenant)
        login(client, user.email)
        return user
    return sign_in


@pytest.fixture()
def admin(as_role):
    return as_role("admin")


@pytest.fixture()
def two_tenants(app):
    return TenantFactory(name="alpha"), TenantFactory(name="bravo")
