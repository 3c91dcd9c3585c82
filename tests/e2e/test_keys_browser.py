"""In headless Chromium: create a tenant API key, reload the page (no second key, no
secret), and paste the Python and curl snippets the page shows: they answer through the
live gateway. docs/key-created.png is taken here with SLUICE_SCREENSHOTS=docs."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.extensions import db
from app.tenants.models import ApiKey
from tests.e2e.conftest import sign_in
from tests.factories import UserFactory
from tests.gateway.conftest import make_world, publish_and_wait

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture()
def world(app, gateway, fake_replicas, frontier):  # noqa: F811
    return make_world(app, gateway, [s.url for s in fake_replicas], frontier.url)


def _keys(tenant_id: int) -> int:
    db.session.expire_all()
    return db.session.scalar(db.select(db.func.count(ApiKey.id))
                             .where(ApiKey.tenant_id == tenant_id))


def test_new_key_page_survives_a_reload_and_its_snippets_work(app, world, console, page,
                                                              monkeypatch, tmp_path):
    monkeypatch.setitem(app.config, "GATEWAY_URL", world.gateway.url)
    tenant = world.tenant
    before = _keys(tenant.id)
    sign_in(page, console, UserFactory(role="admin").email)
    page.goto(console + f"/tenants/{tenant.id}/keys")
    page.fill("input[name=name]", "support-bot prod")
    page.click("button:has-text('Create key')")
    page.wait_for_selector("#new-key")
    assert _keys(tenant.id) == before + 1
    plaintext = page.inner_text("#key-plaintext").strip()
    python_snippet = page.inner_text("#snippet-python")
    curl_snippet = page.inner_text("#snippet-curl")
    assert plaintext in python_snippet and world.gateway.url + "/v1" in python_snippet
    out = DOCS if os.environ.get("SLUICE_SCREENSHOTS") == "docs" else tmp_path
    page.locator("#new-key").screenshot(path=str(out / "key-created.png"))

    page.reload()
    assert page.locator("#new-key").count() == 0
    assert plaintext not in page.content() and "was shown once" in page.content()
    assert _keys(tenant.id) == before + 1            # the reload created nothing

    # the gateway learns of the key from the snapshot (published on commit); then paste
    publish_and_wait(world.gateway)
    out = subprocess.run([sys.executable, "-c", python_snippet], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip()                        # the model's reply, printed
    if shutil.which("curl"):
        out = subprocess.run(["bash", "-c", curl_snippet], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0 and '"choices"' in out.stdout, (out.stdout, out.stderr)
