import pytest

from app.auth.service import create_admin_token
from tests.console.web import browser
from tests.factories import UserFactory


class Api:
    """Calls /api/v1 with one user's bearer token."""

    def __init__(self, client, token: str) -> None:
        self.client, self.headers = client, {"Authorization": f"Bearer {token}"}

    def __getattr__(self, method: str):
        def call(path: str, json=None, **kwargs):
            return self.client.open(f"/api/v1{path}", method=method.upper(), json=json,
                                    headers=self.headers, **kwargs)
        return call


@pytest.fixture()
def api_as(app):
    """An API client for a fresh user with ``role`` (optionally scoped to ``tenant``)."""
    def make(role: str, tenant=None) -> Api:
        user = UserFactory(role=role, tenant=tenant)
        _row, token = create_admin_token(user, "test")
        api = Api(browser(app), token)
        api.user = user
        return api
    return make
