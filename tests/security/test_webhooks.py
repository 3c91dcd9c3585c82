"""Security finding 11: a tenant finops user's budget webhook cannot reach internal
addresses (Redis, the cloud metadata service, the private network)."""
from __future__ import annotations

import pytest

from app.errors import ValidationError
from app.finops import service, webhooks
from tests.factories import TenantFactory, UserFactory


@pytest.mark.parametrize("url", [
    "http://169.254.169.254/latest/meta-data/",     # cloud metadata
    "https://169.254.169.254/latest/meta-data/",
    "https://127.0.0.2:6379/",                      # loopback, not the allowed name
    "https://localhost:6379/",
    "https://10.0.0.8/hook", "https://192.168.1.1/hook", "https://[::1]/hook",
    "http://hooks.example.com/x",                   # plain http to a public name
    "https://user:pw@hooks.example.com/x",
    "gopher://127.0.0.1:6379/_FLUSHALL", "https://", "not a url"])
def test_internal_or_plaintext_webhooks_are_refused(app, url):
    tenant = TenantFactory()
    lead = UserFactory(role="finops", tenant=tenant)
    with pytest.raises(ValidationError) as exc:
        service.save_budget(lead, tenant.id, "100", "alert", url)
    assert "webhook_url" in exc.value.errors


def test_public_https_and_operator_allowed_hosts_pass():
    allowed = webhooks.allowed_hosts("alerts.internal, 127.0.0.1")
    # a public address literal needs no DNS on this offline machine
    assert webhooks.problem("https://1.1.1.1/hook", allowed) is None
    assert webhooks.problem("http://127.0.0.1:9000/hook", allowed) is None
    assert webhooks.problem("http://alerts.internal/hook", allowed) is None
    assert webhooks.problem("https://10.1.1.1/hook", allowed) is not None
