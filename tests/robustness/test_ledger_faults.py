"""Ledger ingestion under faults: a poison event goes to the dead-letter stream (with its
error and payload) while the rest land, and a replay stores it once it can be stored,
never twice; PostgreSQL going away mid-drain (a TCP proxy in front of the shared server,
cut and restored) and a real Celery worker SIGKILLed mid-drain lose nothing and count
nothing twice."""
from __future__ import annotations

import re
import threading
import time
import uuid

import orjson
import pytest
import sqlalchemy as sa

from app.extensions import db
from app.ledger.service import GROUP, drain_stream
from app.redis_client import get_redis, keys
from tests.factories import TenantFactory
from tests.robustness.faults import TcpProxy, ledger_counts, report

COST = "0.0000125"


def event(tenant_id: int, n: int, tag: str = "ev", **over) -> dict:
    rid = f"req_{tag}_{tenant_id}_{n}"
    return {"request_id": rid, "at": "2026-12-04T10:00:00+00:00", "tenant_id": tenant_id,
            "workflow": "wf-robust", "workflow_name": "", "tier": "tier-1", "model": "tiny",
            "status": 200, "cache": "miss", "prompt_tokens": 10, "cached_tokens": 0,
            "completion_tokens": 5, "cost_usd": COST, "baseline_cost_usd": "0.0001",
            "escalated": False, "ttft_ms": 3.0, "latency_ms": 9.0,
            "payload": {"request_id": rid}, **over}


def push_batches(r, events: list[dict], per_entry: int = 50) -> None:
    """As gateways write them: entries of up to ``per_entry`` events (field ``b``)."""
    pipe = r.pipeline()
    for i in range(0, len(events), per_entry):
        pipe.xadd(keys().ledger_stream(), {"b": orjson.dumps(events[i:i + per_entry])})
    pipe.execute()


def _dead_of(r, tenant_id: int) -> list[tuple[bytes, dict]]:
    out = []
    for entry_id, f in r.xrange(keys().ledger_dead()):
        try:
            ev = orjson.loads(f.get(b"e", b"null"))
        except orjson.JSONDecodeError:
            continue
        if isinstance(ev, dict) and ev.get("tenant_id") == tenant_id:
            out.append((entry_id, f))
    return out


@pytest.fixture()
def refusing_trigger(app):
    """A database that refuses one model's rows (as a half-done migration would), until
    the test lifts it."""
    if db.engine.dialect.name != "postgresql":
        pytest.skip("needs PostgreSQL")
    name = f"refuse_{uuid.uuid4().hex[:8]}"
    model = f"refused-{name}"
    with db.engine.begin() as conn:
        conn.execute(sa.text(f"""CREATE FUNCTION {name}() RETURNS trigger AS $$ BEGIN
            IF NEW.model = '{model}' THEN RAISE EXCEPTION 'refused by {name}'; END IF;
            RETURN NEW; END $$ LANGUAGE plpgsql"""))
        conn.execute(sa.text(f"CREATE TRIGGER {name} BEFORE INSERT ON ledger_entries "
                             f"FOR EACH ROW EXECUTE FUNCTION {name}()"))

    def lift() -> None:
        with db.engine.begin() as conn:
            conn.execute(sa.text(f"DROP TRIGGER IF EXISTS {name} ON ledger_entries"))
            conn.execute(sa.text(f"DROP FUNCTION IF EXISTS {name}()"))
    yield model, lift
    lift()


def test_poison_event_is_dead_lettered_and_replayed_once(app, client, refusing_trigger):
    from app.auth.service import create_admin_token
    from tests.factories import UserFactory
    model, lift = refusing_trigger
    r, t = get_redis(), TenantFactory()
    db.session.commit()
    drain_stream(max_batches=50)   # what earlier tests left in the stream is not counted here
    good = [event(t.id, i) for i in range(20)]
    poison = [event(t.id, 100, model="nul\x00byte"),                 # text PostgreSQL refuses
              event(t.id, 101, cost_usd="1e12"),                     # numeric(18,10) overflow
              event(t.id, 102, model=model)]                         # refused until lifted
    push_batches(r, good[:10] + poison + good[10:], per_entry=8)
    inserted = drain_stream(max_batches=50)
    dead = _dead_of(r, t.id)
    assert inserted == 20 and ledger_counts(t.id)["rows"] == 20
    assert sorted(orjson.loads(f[b"e"])["request_id"] for _, f in dead) == \
        sorted(p["request_id"] for p in poison)
    assert all(f[b"error"] and f[b"entry"] for _, f in dead)
    assert r.xpending(keys().ledger_stream(), GROUP)["pending"] == 0
    push_batches(r, [event(t.id, i, tag="after") for i in range(5)] + good[:3])
    assert drain_stream() == 5, "ingestion moved on (and a resent event is not counted twice)"

    admin = UserFactory(role="finops")
    _row, token = create_admin_token(admin, "replay")
    auth = {"Authorization": f"Bearer {token}"}
    listed = client.get("/api/v1/ledger/dead-letters?limit=500", headers=auth).json
    mine = [e for e in listed["entries"] if e["tenant_id"] == t.id]
    assert listed["count"] >= 3 and len(mine) == 3
    assert any("NUL" in e["error"] or "0x00" in e["error"] for e in mine)
    lift()
    out = client.post("/api/v1/ledger/dead-letters/replay", headers=auth,
                      json={"ids": [e["id"] for e in mine]}).json
    assert out == {"replayed": 3, "stored": 1, "duplicates": 0, "failed": 2}
    # a dead letter whose row is in the ledger already (say, replayed by two operators)
    r.xadd(keys().ledger_dead(), {"e": orjson.dumps(good[0]), "error": "copy", "entry": "0-0"})
    again = client.post("/api/v1/ledger/dead-letters/replay", headers=auth, json={}).json
    left = _dead_of(r, t.id)
    counts = ledger_counts(t.id)
    page = client.get("/ledger/dead-letters")  # the console (signed out: to /login)
    report("poison ledger event", events=len(good) + len(poison) + 5,
           poison=len(poison), ingested_first_pass=inserted, dead_lettered=len(dead),
           replay_stored=out["stored"], replay_still_failing=out["failed"],
           second_replay_duplicates=again["duplicates"], ledger_rows=counts["rows"],
           duplicates=counts["rows"] - counts["distinct"], dead_letters_left=len(left))
    assert again["duplicates"] >= 1 and counts["rows"] == counts["distinct"] == 26
    assert sorted(orjson.loads(f[b"e"])["request_id"] for _, f in left) == \
        sorted(p["request_id"] for p in poison[:2])
    assert all(f[b"attempts"] == b"2" for _, f in left)  # replayed twice, failed twice
    assert page.status_code in (302, 303)


def test_dead_letter_count_and_replay_on_the_console(app, client):
    from tests.console.web import csrf_from, login
    from tests.factories import UserFactory
    r, t = get_redis(), TenantFactory()
    db.session.commit()
    r.xadd(keys().ledger_dead(), {"e": orjson.dumps(event(t.id, 1, tag="console")),
                                  "error": "DataError: simulated", "entry": "1-0"})
    finops = UserFactory(role="finops")
    login(client, finops.email)
    dash = client.get("/finops").get_data(as_text=True)
    n = get_redis().xlen(keys().ledger_dead())
    assert re.search(rf'id="ledger-dead-letters".*<strong>{n:,}</strong>', dash)
    page = client.get("/ledger/dead-letters")
    html = page.get_data(as_text=True)
    assert page.status_code == 200 and f"req_console_{t.id}_1" in html
    resp = client.post("/ledger/dead-letters/replay", data={"csrf_token": csrf_from(html)})
    assert resp.status_code in (302, 303)
    assert ledger_counts(t.id)["rows"] == 1 and not _dead_of(r, t.id)


def test_postgres_restart_mid_drain_loses_and_doubles_nothing(app, app_config):
    """The drain's database goes away (every connection cut, new ones refused) and comes
    back while a drain loop runs, as Celery beat would run it: every event lands once and
    none is dead-lettered for the outage."""
    from app.factory import create_app
    url = sa.engine.make_url(app_config["SQLALCHEMY_DATABASE_URI"])
    if url.get_backend_name() != "postgresql":
        pytest.skip("needs PostgreSQL")
    proxy = TcpProxy(url.port or 5432, url.host or "127.0.0.1")
    via_proxy = url.set(host="127.0.0.1", port=proxy.port)
    other = create_app({**app_config, "SQLALCHEMY_DATABASE_URI":
                        via_proxy.render_as_string(hide_password=False)}, env="test")
    r, t = get_redis(), TenantFactory()
    db.session.commit()
    n = 3000
    dead_before = r.xlen(keys().ledger_dead())
    push_batches(r, [event(t.id, i, tag="pg") for i in range(n)], per_entry=5)
    errors: list[str] = []
    stop, cut = threading.Event(), threading.Event()
    committed: list[int] = []

    def after_commit(ids) -> None:
        # The 5th batch (of 25 entries of 5 events) committed and is not acked yet: the
        # database goes away now.
        committed.append(len(ids))
        if len(committed) == 5:
            proxy.cut()
            cut.set()

    def drain_loop() -> None:
        with other.app_context():
            while not stop.is_set():
                try:
                    if not drain_stream(max_batches=5, batch_size=25, min_idle_ms=0,
                                        on_committed=after_commit):
                        time.sleep(0.05)
                except Exception as exc:  # noqa: BLE001 - as a beat task: fails, runs again
                    errors.append(type(exc).__name__)
                    time.sleep(0.1)
            db.session.remove()
            db.engine.dispose()

    worker = threading.Thread(target=drain_loop)
    worker.start()
    try:
        assert cut.wait(60), f"the drain never got going: {errors[:3]} {committed}"
        at_cut = ledger_counts(t.id)["rows"]
        time.sleep(1.0)
        proxy.restore()
        deadline = time.monotonic() + 90
        while ledger_counts(t.id)["rows"] < n and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop.set()
        worker.join(30)
        proxy.close()
    counts = ledger_counts(t.id)
    report("PostgreSQL restarted", events=n, rows_at_cut=at_cut, drain_errors=len(errors),
           ledger_rows=counts["rows"], lost=n - counts["distinct"],
           duplicates=counts["rows"] - counts["distinct"],
           dead_lettered=r.xlen(keys().ledger_dead()) - dead_before)
    assert 0 < at_cut < n, "the cut should land mid-drain"
    assert errors, "the drain should have seen the database go away"
    assert counts["rows"] == counts["distinct"] == n
    assert counts["cost"] == n * ledger_cost()
    assert r.xlen(keys().ledger_dead()) == dead_before


def ledger_cost():
    from decimal import Decimal
    return Decimal(COST)


def test_worker_killed_mid_drain_loses_and_doubles_nothing(app, app_config, tmp_path):
    """A real Celery worker (its own queue) SIGKILLed while it drains in small batches:
    the next drain takes over its unacked entries; every event lands once."""
    from tests.celery_workers import start_worker
    from workers.tasks.ledger import drain
    r, t = get_redis(), TenantFactory()
    db.session.commit()
    n = 3000
    push_batches(r, [event(t.id, i, tag="wk") for i in range(n)], per_entry=5)
    queue = f"robust-{uuid.uuid4().hex[:8]}"
    with start_worker(app_config, tmp_path, queue=queue, name="robust") as worker:
        drain.apply_async(kwargs={"max_batches": 1000, "batch_size": 20}, queue=queue)
        worker.wait_for(lambda: ledger_counts(t.id)["rows"] >= 300, 60, "the drain started")
        worker.process.kill()  # SIGKILL mid-drain
        worker.process.wait(10)
    at_kill = ledger_counts(t.id)["rows"]
    pending = r.xpending(keys().ledger_stream(), GROUP)["pending"]
    drain_stream(max_batches=1000, min_idle_ms=0)
    counts = ledger_counts(t.id)
    report("worker killed mid-drain", events=n, rows_at_kill=at_kill,
           unacked_at_kill=pending, ledger_rows=counts["rows"],
           lost=n - counts["distinct"], duplicates=counts["rows"] - counts["distinct"])
    assert 0 < at_kill < n, "the kill should land mid-drain"
    assert counts["rows"] == counts["distinct"] == n
    assert counts["cost"] == n * ledger_cost()
    assert r.xpending(keys().ledger_stream(), GROUP)["pending"] == 0
