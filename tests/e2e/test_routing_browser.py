"""In headless Chromium: the Routing page with a ``kv_events`` tenant shows the policy in
force and, per replica of the pool, index freshness, the matched share of prompt tokens,
the engines' hit rate and the two live figures kv_events weighs (in flight, prefill
pending); the page draws without a Content-Security-Policy or script error (the ``page``
fixture fails the test on either). docs/routing-kv.png is taken here with
SLUICE_SCREENSHOTS=docs."""
from __future__ import annotations

import os
from pathlib import Path

from app.contract import kv_index
from app.contract.inflight import InflightTracker
from app.contract.keys import Keys
from tests.e2e.conftest import sign_in
from tests.factories import TenantFactory, UserFactory, kv_events_pool

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_routing_page_shows_the_kv_index_per_replica(app, console, page, redis_client,
                                                    tmp_path):
    tenant = TenantFactory()
    fresh, silent = kv_events_pool(tenant, "kvpool-browser")
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
        assert "1 tenant on kv_events" in " ".join(section.inner_text().split())
        head = section.locator("table").first.locator("th").all_inner_texts()
        cols = [" ".join(h.split()) for h in head]

        def cells(replica: str) -> dict[str, str]:
            row = section.locator("tr", has_text=replica)
            return dict(zip(cols, (c.strip() for c in row.locator("td").all_inner_texts())))
        got = cells("kvpool-browser-0")
        assert got["Index age"].endswith(" s")
        # its index age is marked fresh (the page's ok class)
        assert section.locator("tr", has_text="kvpool-browser-0").locator(".ok").count() == 1
        assert {c: got[c] for c in ("Seq", "Blocks", "Routed", "Matched share", "In flight",
                                    "Prefill pending", "Engine hit rate")} == {
            "Seq": "7", "Blocks": "3", "Routed": "4", "Matched share": "75.0%",
            "In flight": "1", "Prefill pending": "2,048 tokens", "Engine hit rate": "50.0%"}
        other = cells("kvpool-browser-1")
        assert {c: other[c] for c in ("Index age", "Blocks", "Matched share", "In flight",
                                      "Prefill pending")} == {
            "Index age": "—", "Blocks": "0", "Matched share": "—", "In flight": "0",
            "Prefill pending": "0 tokens"}
        shots = os.environ.get("SLUICE_SCREENSHOTS")
        out = (DOCS if shots == "docs" else tmp_path) / "routing-kv.png"
        section.screenshot(path=str(out))
        assert out.stat().st_size > 1000
    finally:
        gw.release(fresh.id, 2048)
        kv_index.forget(redis_client, keys, fresh.id)
        redis_client.delete(keys.replica_stats(fresh.id))
