import pytest

from tests.console.web import browser


@pytest.fixture()
def client(app):
    return browser(app)
