"""The ledger drain: exactly one row per request_id, whatever crashes where."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from app.extensions import db
from app.ledger.models import LedgerEntry
from app.ledger.service import GROUP, drain_stream
from app.redis_client import keys
from app.workflows.models import Workflow
from tests.factories import TenantFactory

ROOT = Path(__file__).resolve().parents[2]


def event(tenant_id: int, n: int, workflow: str = "wf-a") -> dict:
    return {"request_id": f"req_{tenant_id}_{n}", "at": "2026-12-02T10:00:00+00:00",
            "tenant_id": tenant_id, "workflow": workflow, "workflow_name": "", "tier": "tier-1",
            "model": "tiny", "status": 200, "cache": "miss", "prompt_tokens": 10,
            "cached_tokens": 4, "completion_tokens": 5, "cost_usd": "0.0000012",
            "baseline_cost_usd": "0.0000875", "escalated": False, "ttft_ms": 3.5,
            "latency_ms": 9.0, "payload": {"request_id": f"req_{tenant_id}_{n}"}}


def push(redis_client, events: list[dict]) -> None:
    stream = keys().ledger_stream()
    pipe = redis_client.pipeline()
    for ev in events:
        pipe.xadd(stream, {"e": orjson.dumps(ev)})
    pipe.execute()


def count(tenant_id: int) -> int:
    db.session.expire_all()
    return db.session.scalar(db.select(db.func.count()).select_from(LedgerEntry).where(
        LedgerEntry.tenant_id == tenant_id))


def pending(redis_client) -> int:
    return redis_client.xpending(keys().ledger_stream(), GROUP)["pending"]


@pytest.fixture(autouse=True)
def own_stream(app):
    """The ledger stream is the session's: what earlier tests' gateways left in it (a test
    that failed before draining its rows) is drained first, so each test counts its own
    (seen: 12 rows for this file's 10 after a failed integration test)."""
    drain_stream(max_batches=1000, min_idle_ms=0)


def test_duplicates_and_redelivery_count_once(app, redis_client):
    t = TenantFactory()
    evs = [event(t.id, i) for i in range(10)]
    push(redis_client, evs + evs[:4])  # at-least-once delivery from the gateway side
    assert drain_stream(batch_size=3) == 10
    push(redis_client, evs[5:7])
    assert drain_stream() == 0
    assert count(t.id) == 10
    row = db.session.scalar(db.select(LedgerEntry).where(LedgerEntry.request_id == evs[0]["request_id"]))
    assert str(row.cost_usd.normalize()) == "0.0000012" and row.cached_tokens == 4
    wf = db.session.scalars(db.select(Workflow).where(Workflow.tenant_id == t.id)).all()
    assert [w.signature for w in wf] == ["wf-a"]


def test_poison_entry_is_moved_aside(app, redis_client):
    t = TenantFactory()
    stream = keys().ledger_stream()
    redis_client.xadd(stream, {"e": b"{broken"})
    push(redis_client, [event(t.id, 1)])
    redis_client.xadd(stream, {"e": orjson.dumps({"request_id": "x"})})  # no tenant
    assert drain_stream() == 1
    assert redis_client.xlen(keys().ledger_dead()) >= 2
    assert pending(redis_client) == 0


def test_deleted_tenant_rows_still_land(app, redis_client):
    t = TenantFactory()
    push(redis_client, [event(t.id + 10_000, 1)])  # tenant gone: no workflow, row kept
    assert drain_stream() == 1


def _run(app_config, mode: str, batch: int) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "tests.ledger.drain_proc",
                             json.dumps(app_config), mode, str(batch)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout.readline().strip() == "READY"
    return proc


def test_crash_after_commit_before_ack_counts_once(app, redis_client, app_config):
    t = TenantFactory()
    push(redis_client, [event(t.id, i) for i in range(50)])
    proc = _run(app_config, "crash-after-commit", 20)
    assert proc.wait(60) == -9
    assert count(t.id) == 20           # the first batch committed ...
    assert pending(redis_client) == 20  # ... and was never acked
    # a later drain takes over the dead consumer's entries and skips what is in SQL
    assert drain_stream(min_idle_ms=0) == 30
    assert count(t.id) == 50 and pending(redis_client) == 0


def test_kill_at_any_moment_loses_nothing(app, redis_client, app_config):
    t = TenantFactory()
    n = 3000
    push(redis_client, [event(t.id, i) for i in range(n)])
    proc = _run(app_config, "slow", 25)
    deadline = time.monotonic() + 60
    while count(t.id) < 200 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    proc.kill()
    proc.wait(30)
    partial = count(t.id)
    assert 0 < partial < n, "the kill should land mid-drain"
    drain_stream(max_batches=1000, min_idle_ms=0)
    assert count(t.id) == n
    assert pending(redis_client) == 0 and redis_client.xlen(keys().ledger_stream()) == 0


def test_new_workflows_reach_the_gateway_snapshot(app, redis_client):
    t = TenantFactory()
    push(redis_client, [event(t.id, 1, workflow="wf-new")])
    drain_stream()
    snap = orjson.loads(redis_client.get(keys().snapshot_data()))
    assert f"{t.id}:wf-new" in snap["workflows"]


def test_a_bad_event_in_a_gateway_batch_is_moved_aside_alone(app, redis_client):
    """A batch entry (field ``b``) with one event the table cannot take: the others land,
    the bad one goes to the dead stream, and the stream is not stuck on it."""
    t = TenantFactory()
    stream, dead = keys().ledger_stream(), keys().ledger_dead()
    bad = {**event(t.id, 2), "status": "not-a-number"}
    dead_before = redis_client.xlen(dead)
    redis_client.xadd(stream, {"b": orjson.dumps([event(t.id, 1), bad, event(t.id, 3)])})
    assert drain_stream() == 2
    assert count(t.id) == 2
    assert pending(redis_client) == 0
    moved = redis_client.xrange(dead)[dead_before:]
    assert [orjson.loads(f[b"e"])["request_id"] for _, f in moved] == [bad["request_id"]]
    assert drain_stream() == 0  # nothing left to retry
