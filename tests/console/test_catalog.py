"""Tiers and pools in the console."""
from decimal import Decimal

from app.audit.models import AuditLog
from app.catalog.models import Pool, Replica, Tier
from app.extensions import db
from tests.console.web import submit
from tests.factories import PoolFactory

TIER = {"name": "tier-7", "rank": "7", "model": "big-model", "price_input_per_m": "1.2",
        "price_cached_input_per_m": "0.3", "price_output_per_m": "4.8",
        "upstream_kind": "external", "pool_id": "", "endpoint_url": "https://llm.example/v1",
        "api_key_env": "SLUICE_PROVIDER_KEY_FRONTIER", "timeout_s": "30", "enabled": "on"}


def test_tier_create_and_edit_with_blended_price_and_audit(client, admin):
    resp = submit(client, "/catalog/tiers/new", TIER)
    assert resp.status_code == 302
    tier = db.session.scalar(db.select(Tier))
    assert tier.price_output_per_m == Decimal("4.8") and tier.api_key_env == "SLUICE_PROVIDER_KEY_FRONTIER"
    html = client.get("/catalog/tiers").get_data(as_text=True)
    assert "tier-7" in html and "$2.10" in html  # (3 * 1.2 + 4.8) / 4
    pool = PoolFactory(name="gpu-a")
    resp = submit(client, f"/catalog/tiers/{tier.id}/edit",
                  {**TIER, "upstream_kind": "pool", "pool_id": str(pool.id), "enabled": ""})
    assert resp.status_code == 302
    db.session.expire_all()
    tier = db.session.get(Tier, tier.id)
    assert tier.pool_id == pool.id and tier.endpoint_url == "" and tier.enabled is False
    row = db.session.scalar(db.select(AuditLog).where(AuditLog.action == "tier.update"))
    assert row.before["upstream_kind"] == "external" and row.after["pool_id"] == pool.id


def test_invalid_tier_changes_nothing(client, admin):
    resp = submit(client, "/catalog/tiers/new", {**TIER, "price_input_per_m": "cheap",
                                                 "endpoint_url": "ftp://x",
                                                 "api_key_env": "sk-live-123"})
    assert resp.status_code == 422
    html = resp.get_data(as_text=True)
    assert "must be a number" in html and "http(s) URL" in html and "looks like a key" in html
    assert 'value="cheap"' in html
    resp = submit(client, "/catalog/tiers/new", {**TIER, "upstream_kind": "pool", "pool_id": ""})
    assert resp.status_code == 422 and "choose an existing pool" in resp.get_data(as_text=True)
    assert db.session.scalar(db.select(db.func.count(Tier.id))) == 0
    assert db.session.scalar(db.select(db.func.count(AuditLog.id))) == 0


def test_pool_create_with_options_json_and_desired_replicas(client, admin):
    data = {"name": "gpu-b", "node": "local", "engine": "vllm", "model": "Qwen/Qwen3-8B",
            "served_model_name": "", "options": '{"quantization": "fp8"}',
            "desired_replicas": "2", "base_port": "8600", "gpu_type": "H100",
            "gpus_per_replica": "1", "capacity_weight": "1"}
    assert submit(client, "/catalog/pools/new", data).status_code == 302
    pool = db.session.scalar(db.select(Pool))
    assert pool.options == {"quantization": "fp8"}
    assert db.session.scalar(db.select(db.func.count(Replica.id))) == 2
    resp = submit(client, f"/catalog/pools/{pool.id}/edit",
                  {**data, "options": "{not json", "desired_replicas": "-1"})
    assert resp.status_code == 422
    html = resp.get_data(as_text=True)
    assert "must be a JSON object" in html and "from 0 to 64" in html
    db.session.expire_all()
    assert db.session.get(Pool, pool.id).desired_replicas == 2
    assert submit(client, f"/catalog/pools/{pool.id}/edit",
                  {**data, "desired_replicas": "1"}).status_code == 302
    row = db.session.scalar(db.select(AuditLog).where(AuditLog.action == "pool.update"))
    assert row.before["desired_replicas"] == 2 and row.after["desired_replicas"] == 1
    assert "gpu-b" in client.get("/catalog/pools").get_data(as_text=True)


def test_a_pool_whose_ports_another_pool_binds_on_its_node_is_refused(client, admin):
    data = {"name": "gpu-a", "node": "local", "engine": "reference", "model": "smollm2",
            "served_model_name": "", "options": '{"kv_events": true}',
            "desired_replicas": "2", "base_port": "8600", "gpu_type": "",
            "gpus_per_replica": "0", "capacity_weight": "1"}
    assert submit(client, "/catalog/pools/new", data).status_code == 302
    # KV events on a second pool of the node: replica 0's PUB port would be gpu-a's
    second = {**data, "name": "gpu-b", "base_port": "8700"}
    resp = submit(client, "/catalog/pools/new", second)
    assert resp.status_code == 409
    assert ("port 5557 (replica 0 KV events) is pool gpu-a&#39;s replica 0 KV events on "
            "node local, and 3 more") in resp.get_data(as_text=True)
    assert submit(client, "/catalog/pools/new",
                  {**second, "options": '{"kv_events": {"port": 5567}}'}).status_code == 302
    # an HTTP port inside gpu-a's range
    third = {**data, "name": "gpu-c", "base_port": "8601", "options": "{}"}
    resp = submit(client, "/catalog/pools/new", third)
    assert resp.status_code == 409
    assert "port 8601 (replica 0 HTTP) is pool gpu-a&#39;s replica 1 HTTP" in \
        resp.get_data(as_text=True)
    # another node binds its own ports; a pool never clashes with itself
    assert submit(client, "/catalog/pools/new",
                  {**third, "node": "gpu-node-2"}).status_code == 302
    pool = db.session.scalar(db.select(Pool).where(Pool.name == "gpu-a"))
    assert submit(client, f"/catalog/pools/{pool.id}/edit",
                  {**data, "desired_replicas": "1"}).status_code == 302
    assert len(db.session.scalars(db.select(Pool)).all()) == 3
