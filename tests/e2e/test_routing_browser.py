"""In headless Chromium: the Routing page with a ``kv_events`` tenant shows the policy in
force and, per replica of the pool, index freshness, the matched share of prompt tokens,
the engines' hit rate and the two live figures kv_events weighs (in flight, prefill
pending); the page draws without a Content-Security-Policy or script error (the ``page``
fixture fails the test on either). docs/routing-kv.png is taken here with
SLUICE_SCREENSHOTS=docs."""
from __future__ import annotations

import os
from pathlib import Path

from app.catalog.models import Pool, Replica
from app.contract import kv_index
from app.contract.inflight import InflightTracker
from app.contract.keys import Keys
from app.extensions import db
from app.policies.models import Policy
from tests.e2e.conftest import sign_in
from tests.factories import TenantFactory, UserFactory

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_routing_page_shows_the_kv_index_per_replica(app, console, page, redis_client,
                                                    tmp_path):
    tenant = TenantFactory()
    db.session.add(Policy(tenant_id=tenant.id, values={"replica_choice": "kv_events"}))
    pool = Pool(name="kvpool-browser", model="tiny", served_model_name="tiny",
                engine="reference", options={"kv_events": True})
    db.session.add(pool)
    db.session.flush()
    fresh = Replica(pool_id=pool.id, index=0, url="http://127.0.0.1:9", state="healthy")
    silent = Replica(pool_id=pool.id, index=1, url="http://127.0.0.1:10", state="healthy")
    db.session.add_all([fresh, silent])
    db.session.commit()
    keys = Keys(app.config["REDIS_NAMESPACE"])
    kv_index.apply_events(redis_client, keys, fresh.id,
                          [("BlockStored", [bytes([i]) * 32 for i in range(1, 4)])], seq=7)
    # a gateway's S03 call writes its earlier choices' tally (the sync client: Playwright's
    # sync API holds this thread's event loop)
    kv_index.read_route_inputs(redis_client, keys, [fresh.id, silent.id], b"", 16,
                               tally={fresh.id: (4, 900, 1200)})
    redis_client.hset(keys.replica_stats(fresh.id), "prefix_cache_hit_rate", "0.5")
    gw = InflightTracker(redis_client, keys, gateway_id="gw-browser")
    gw.acquire(fresh.id, 2048)          # a streamed request awaiting its first token
    try:
        sign_in(page, console, UserFactory(role="viewer", tenant=tenant).email)
        page.goto(console + "/routing/")
        section = page.locator("#kv-routing")
        text = section.inner_text()
        assert "kv_events" in text
        row = section.locator("tr", has_text="kvpool-browser-0")
        cells = row.inner_text()
        # seq 7, 3 blocks, matched share 900 / 1200, engine hit rate, 1 in flight,
        # 2,048 tokens to prefill
        for want in ("7", "3", "75.0%", "50.0%", "2,048 tokens"):
            assert want in cells, (want, cells)
        assert row.locator(".ok").count() == 1           # its index is fresh
        other = section.locator("tr", has_text="kvpool-browser-1").inner_text()
        assert "75.0%" not in other and "0 tokens" in other
        shots = os.environ.get("SLUICE_SCREENSHOTS")
        out = (DOCS if shots == "docs" else tmp_path) / "routing-kv.png"
        section.screenshot(path=str(out))
        assert out.stat().st_size > 1000
    finally:
        gw.release(fresh.id, 2048)
        kv_index.forget(redis_client, keys, fresh.id)
        redis_client.delete(keys.replica_stats(fresh.id))
