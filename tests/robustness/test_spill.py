"""The gateway's ledger writer at its in-memory cap spills to the spool instead of
dropping: every event reaches the stream once the backlog drains, and a writer killed
while spilling leaves a spool the next one sends on whole."""
from __future__ import annotations

import asyncio

import orjson
import redis.asyncio as aioredis

from app.contract.keys import Keys
from app.gateway.ledger_writer import LedgerWriter
from tests.conftest import REDIS_URL
from tests.robustness.faults import report


def _stream_ids(redis_client, stream: str) -> list[str]:
    out = []
    for _, f in redis_client.xrange(stream):
        out += [ev["request_id"] for ev in orjson.loads(f[b"b"])]
    return out


def test_backlog_cap_spills_to_the_spool_and_loses_nothing(app, redis_client, tmp_path):
    k = Keys(f"{app.config['REDIS_NAMESPACE']}spill")
    n, cap = 500, 40

    async def run() -> tuple[dict, dict]:
        client = aioredis.Redis.from_url(REDIS_URL)
        w = LedgerWriter(client, k, spool_dir=tmp_path, max_backlog=cap, batch=16)
        for i in range(n):  # a burst with no await: the writer cannot run meanwhile
            w.submit({"request_id": f"spill-{i}", "tenant_id": 1})
        at_cap = {"queued": len(w.queue), "spilled": w.spilled, "dropped": w.dropped,
                  "spool_lines": w.spool.path.read_bytes().count(b"\n")}
        await w.flush()
        after = {"written": w.written, "queued": len(w.queue), "spilling": w.spill_at is not None,
                 "spool_bytes": w.spool.path.stat().st_size}
        w.close()
        # killed mid-spill: a second writer's burst, then its process "dies" (no flush)
        dying = LedgerWriter(client, k, spool_dir=tmp_path, max_backlog=cap, batch=16)
        for i in range(n, n + 100):
            dying.submit({"request_id": f"spill-{i}", "tenant_id": 1})
        dying.spool.close(remove=False)
        heir = LedgerWriter(client, k, spool_dir=tmp_path, max_backlog=cap, batch=16)
        after["recovered"] = heir.recovered
        await heir.flush()
        heir.close()
        await client.aclose()
        return at_cap, after

    at_cap, after = asyncio.run(run())
    ids = _stream_ids(redis_client, k.ledger_stream())
    for key in redis_client.scan_iter(f"{k.ns}:*"):
        redis_client.delete(key)
    report("gateway backlog cap", events=n + 100, cap=cap, queued_at_cap=at_cap["queued"],
           spilled=at_cap["spilled"], dropped=at_cap["dropped"],
           recovered_by_heir=after["recovered"],
           on_stream=len(ids), distinct=len(set(ids)))
    assert at_cap == {"queued": cap, "spilled": n - cap, "dropped": 0, "spool_lines": n}
    assert after["written"] == n and not after["queued"] and not after["spilling"]
    assert after["spool_bytes"] == 0, "a drained spool starts over"
    assert after["recovered"] == 100
    assert sorted(set(ids)) == sorted(f"spill-{i}" for i in range(n + 100))
    assert len(ids) == n + 100, "nothing was sent twice"
    assert not list(tmp_path.glob("ledger-*.spool"))
