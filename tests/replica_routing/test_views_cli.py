"""Routing console page and the sim CLI, through the real app."""
from __future__ import annotations

import json
import re

from app.replica_routing import service
from app.contract.lint import record_prompt_sample
from tests.factories import TenantFactory, UserFactory


def login(client, user):
    with client.session_transaction() as s:
        s["_user_id"] = user.get_id()  # "<id>.<session epoch>"
        s["_fresh"] = True


def csrf(html: str) -> str:
    return re.search(r'name="csrf_token" value="([^"]+)"', html).group(1)


def test_page_shows_latest_simulation_chart_and_tenant_scoped_lint(app, client, redis_client):
    t1, t2 = TenantFactory(), TenantFactory()
    ns = app.config["REDIS_NAMESPACE"]
    for i in range(3):
        record_prompt_sample(redis_client, ns, t1.id, "wf-mine",
                             f"Now 2026-12-02T10:0{i}:00Z. You are the billing bot. " * 3)
        record_prompt_sample(redis_client, ns, t2.id, "wf-theirs", f"req_{i:09d} other bot")
    service.run_seed_simulation(replicas=4, kv_tokens=65_536, requests=600)
    viewer = UserFactory(role="viewer", tenant=t1)
    login(client, viewer)
    page = client.get("/routing/")
    assert page.status_code == 200
    html = page.text
    assert "Plotly.newPlot" in html and "/routing/plotly.js" in html
    for name in ("round_robin", "consistent_hash", "cache_aware", "sluice", "oracle"):
        assert name in html
    assert "wf-mine" in html and "timestamp" in html
    assert "wf-theirs" not in html                        # another tenant's workflow
    assert "Run on the seed preset" not in html           # viewers cannot run it
    js = client.get("/routing/plotly.js")
    assert js.status_code == 200 and len(js.data) > 1_000_000


def test_ops_runs_a_simulation_from_the_page(app, client):
    ops = UserFactory(role="ops")
    login(client, ops)
    page = client.get("/routing/")
    assert "No simulation yet" in page.text
    resp = client.post("/routing/simulate", data={"replicas": "4", "kv_tokens": "65536",
                                                  "requests": "500",
                                                  "csrf_token": csrf(page.text)})
    assert resp.status_code == 302
    runs = service.latest_simulations()
    assert len(runs) == 1 and runs[0].result["replicas"] == 4
    assert runs[0].result["requests"] == 500
    bad = client.post("/routing/simulate", data={"replicas": "4", "kv_tokens": "65536",
                                                 "requests": "999999",
                                                 "csrf_token": csrf(page.text)},
                      follow_redirects=True)
    assert "requests: must be between" in bad.text
    assert len(service.latest_simulations()) == 1


def test_viewer_cannot_run_simulations(app, client):
    login(client, UserFactory(role="viewer"))
    page = client.get("/routing/")
    assert client.post("/routing/simulate", data={"csrf_token": csrf(page.text)}
                       ).status_code == 403


def test_cli_writes_a_workload_and_compares_policies(app, runner, tmp_path):
    out = tmp_path / "seed.jsonl"
    res = runner.invoke(args=["sim", "workload", "--preset", "seed", "--out", str(out),
                              "--requests", "800"])
    assert res.exit_code == 0, res.output
    lines = out.read_text().splitlines()
    assert len(lines) == 800
    assert set(json.loads(lines[0])) == {"arrival_ms", "session_id", "segments",
                                         "output_tokens"}
    res = runner.invoke(args=["sim", "prefix-routing", "--workload", str(out),
                              "--replicas", "4", "--kv-tokens", "65536", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert set(data["policies"]) == {"round_robin", "random", "least_loaded",
                                     "consistent_hash", "prefix_trie", "cache_aware",
                                     "sluice", "kv_events", "oracle"}
    for figures in data["policies"].values():
        assert {"hit_rate", "max_over_mean_load", "ttft_p50_ms", "ttft_p99_ms"} <= set(figures)
    res = runner.invoke(args=["sim", "prefix-routing", "--workload", str(out), "--replicas",
                              "4", "--policies", "sluice,round_robin", "--record"])
    assert res.exit_code == 0, res.output
    assert "sluice vs best non-oracle" in res.output
    assert service.latest_simulations()[0].result["policies"].keys() == {"sluice",
                                                                         "round_robin"}
    bad = runner.invoke(args=["sim", "prefix-routing", "--workload", str(out),
                              "--replicas", "4", "--policies", "magic"])
    assert bad.exit_code != 0 and "unknown policy" in bad.output


def test_drill_replica_loss_is_registered(app, runner):
    res = runner.invoke(args=["drill", "replica-loss", "--help"])
    assert res.exit_code == 0 and "CD-28C" in res.output
    res = runner.invoke(args=["drill", "replica-loss", "--url", "http://127.0.0.1:9",
                              "--key", "k", "--pool", "nope"])
    assert res.exit_code != 0 and "no pool named" in res.output


def test_page_shows_kv_routing_in_force_freshness_share_and_engine_hit_rate(app, client,
                                                                         redis_client):
    import asyncio

    import redis.asyncio as aredis

    from app.contract import kv_index
    from app.contract.keys import Keys
    from app.extensions import db
    from app.policies.models import Policy
    from tests.factories import kv_events_pool
    t1 = TenantFactory()
    db.session.add(Policy(tenant_id=None, values={"replica_choice": "sluice"}))
    fresh, silent = kv_events_pool(t1, "kvpool-page")
    keys = Keys(app.config["REDIS_NAMESPACE"])
    kv_index.apply_events(redis_client, keys, fresh.id, [("BlockStored", [b"a" * 32, b"b" * 32])],
                          seq=41)

    async def tally():     # a gateway's S03 call writes its earlier choices' tally
        r = aredis.Redis.from_url(app.config["REDIS_URL"])
        await kv_index.read_route_inputs_async(r, keys, [fresh.id, silent.id], [], 16,
                                               tally={fresh.id: (2, 300, 400)})
        await r.aclose()
    asyncio.run(tally())
    redis_client.hset(keys.replica_stats(fresh.id), "prefix_cache_hit_rate", "0.625")
    from app.contract.inflight import InflightTracker
    gw = InflightTracker(redis_client, keys, gateway_id="gw-page")
    gw.acquire(fresh.id, 1234)          # a streamed request awaiting its first token
    gw.acquire(fresh.id)
    try:
        login(client, UserFactory(role="viewer", tenant=t1))
        html = client.get("/routing/").text
        section = html[html.index('id="kv-routing"'):html.index("Prompt-template lint")]
        assert "<strong>sluice</strong>" in section and "1 tenant on <code>kv_events</code>" in section
        row_a = section[section.index("kvpool-page-0"):section.index("kvpool-page-1")]
        assert ">41<" in row_a and ">2<" in row_a and "75.0%" in row_a and "62.5%" in row_a
        assert 'class="ok"' in row_a
        assert "<td>2</td><td>1,234 tokens</td>" in row_a    # in flight, prefill pending
        row_b = section[section.index("kvpool-page-1"):]
        assert "75.0%" not in row_b and "—" in row_b       # no index entry, no scrape
        assert "<td>0</td><td>0 tokens</td>" in row_b
    finally:
        gw.release(fresh.id, 1234)
        gw.release(fresh.id)
        kv_index.forget(redis_client, keys, fresh.id)
        redis_client.delete(keys.replica_stats(fresh.id))


def test_prefix_routing_without_a_file_simulates_a_preset_as_its_file_would(app, runner,
                                                                              tmp_path):
    """``flask sim prefix-routing --replicas 8 --kv-tokens 40000`` (issue 17's command)
    stopped at "Missing option '--workload'"; it now generates the preset itself, the same
    rows ``sim workload`` writes."""
    out = tmp_path / "deep.jsonl"
    assert runner.invoke(args=["sim", "workload", "--preset", "deep_tree", "--requests",
                               "300", "--seed", "5", "--out", str(out)]).exit_code == 0
    args = ["--replicas", "4", "--kv-tokens", "20000", "--policies", "sluice,kv_events",
            "--json"]
    from_file = runner.invoke(args=["sim", "prefix-routing", "--workload", str(out), *args])
    in_place = runner.invoke(args=["sim", "prefix-routing", "--preset", "deep_tree",
                                   "--requests", "300", "--seed", "5", *args])
    assert from_file.exit_code == 0 and in_place.exit_code == 0, in_place.output
    assert json.loads(in_place.output) == json.loads(from_file.output)
    table = runner.invoke(args=["sim", "prefix-routing", "--replicas", "2", "--requests",
                                "200", "--policies", "sluice,round_robin"])
    assert table.exit_code == 0, table.output
    assert "200 requests, 2 replicas" in table.output and "preset seed" in table.output


def test_prefix_routing_draws_print_each_policys_spread(app, runner):
    """``--draws N`` runs the workload N times (hash keys salted, seed moved) and prints each
    policy's TTFT p99 spread under the table, which stays draw 0."""
    args = ["sim", "prefix-routing", "--preset", "short_sessions", "--requests", "400",
            "--replicas", "4", "--kv-tokens", "20000",
            "--policies", "cache_aware,kv_events,oracle"]
    one = runner.invoke(args=[*args, "--json"])
    three = runner.invoke(args=[*args, "--json", "--draws", "3"])
    assert one.exit_code == 0 and three.exit_code == 0, three.output
    got = json.loads(three.output)
    assert got["policies"] == json.loads(one.output)["policies"]
    assert {len(v) for d in got["draws"].values() for v in d.values()} == {3}
    table = runner.invoke(args=[*args, "--draws", "3"])
    assert table.exit_code == 0, table.output
    assert "over 3 draws" in table.output
    assert "kv_events TTFT p99 at or under cache_aware's in" in table.output
    assert "of 3 draws" in table.output
    bad = runner.invoke(args=[*args, "--draws", "0"])
    assert bad.exit_code != 0 and "--draws" in bad.output
