"""A captured vLLM /metrics text -> live stats in Redis and a ReplicaMetric row."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from workers.pools.metrics import live_stats, parse_prometheus, read_live, store_live

SAMPLE = (Path(__file__).parent / "data" / "vllm_metrics_sample.txt").read_text()


def test_parse_captured_vllm_metrics_into_live_stats():
    stats = live_stats(parse_prometheus(SAMPLE))
    assert stats["num_requests_running"] == 23
    assert stats["num_requests_waiting"] == 4
    assert stats["kv_cache_usage_perc"] == pytest.approx(0.6183)
    assert stats["prefix_cache_queries"] == 4_591_000
    assert stats["prefix_cache_hits"] == 4_067_626
    assert stats["prefix_cache_hit_rate"] == pytest.approx(0.886, abs=1e-3)
    assert stats["spec_decode_num_draft_tokens"] == 260055
    assert stats["spec_decode_num_accepted_tokens"] == 209321
    assert stats["ttft_seconds_count"] == 1021
    assert stats["ttft_mean_seconds"] == pytest.approx(21.441 / 1021)
    assert stats["lora_adapters"] == "revops-extract,support-faq"


def test_labels_and_data_parallel_engines():
    text = ('vllm:num_requests_waiting{engine="0",model_name="m"} 3\n'
            'vllm:num_requests_waiting{engine="1",model_name="m"} 5\n'
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.2\n'
            'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.7\n'
            'vllm:prefix_cache_hits{engine="0",model_name="m"} 10 1700000000000\n'
            'bad line\n')
    samples = parse_prometheus(text)
    assert samples[("vllm:num_requests_waiting", (("engine", "1"), ("model_name", "m")))] == 5
    stats = live_stats(samples)
    assert stats["num_requests_waiting"] == 8
    assert stats["kv_cache_usage_perc"] == 0.7
    assert stats["prefix_cache_hits"] == 10  # counter without _total, with a timestamp
    assert stats["prefix_cache_hit_rate"] == 0.0  # no queries reported


def test_live_stats_go_to_redis_with_a_ttl_for_the_gateway(app, redis_client):
    from app.redis_client import keys
    from app.contract.inflight import read_loads
    stats = live_stats(parse_prometheus(SAMPLE))
    store_live(redis_client, keys(), 41, stats, ttl_s=30, at=time.time())
    raw = read_live(redis_client, keys(), 41)
    assert float(raw["num_requests_waiting"]) == 4 and float(raw["kv_cache_usage_perc"]) > 0.6
    assert 0 < redis_client.ttl(keys().replica_stats(41)) <= 30
    # the gateway's bounded load reads the scraped queue depth from the same hash
    assert read_loads(redis_client, [41], keys())[41] == 4


def test_scrape_prunes_old_time_series(app):
    from datetime import timedelta

    from app.catalog.models import ReplicaMetric
    from app.catalog.service import sync_replica_rows
    from app.extensions import db
    from app.models_base import utcnow
    from workers.pools.driver import scrape_node
    from tests.factories import PoolFactory
    pool = PoolFactory(node="prunenode")
    sync_replica_rows(pool)
    db.session.commit()
    rid = pool.replicas[0].id
    db.session.add_all([ReplicaMetric(replica_id=rid, at=utcnow() - timedelta(days=3)),
                        ReplicaMetric(replica_id=rid, at=utcnow())])
    db.session.commit()
    assert scrape_node("prunenode") == 0  # nothing serving there
    assert db.session.scalar(db.select(db.func.count(ReplicaMetric.id))) == 1
