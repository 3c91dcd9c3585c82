"""``flask --app wsgi sim ...`` (cluster simulator) and the replica-loss drill."""
from __future__ import annotations

import json
import sys

import click
from flask.cli import AppGroup

from app.core.prefix_sim import DEFAULT_KV_TOKENS
from app.drills.cli import drill_cli

sim_cli = AppGroup("sim", help="Capacity-planning simulators")


def read_workload(path: str) -> list[dict]:
    stream = sys.stdin if path == "-" else open(path, encoding="utf-8")
    try:
        return [json.loads(line) for line in stream if line.strip()]
    finally:
        if stream is not sys.stdin:
            stream.close()


def format_table(result: dict) -> str:
    from app.core.prefix_sim import best_non_oracle
    lines = [f"{result['requests']} requests, {result['replicas']} replicas, "
             f"{result['kv_tokens']:,} KV tokens each; load = {result['load_unit']}",
             f"{'policy':<16} {'hit rate':>9} {'max/mean':>9} {'TTFT p50':>10} {'TTFT p99':>10}"]
    for name, r in result["policies"].items():
        lines.append(f"{name:<16} {r['hit_rate']:>9.1%} {r['max_over_mean_load']:>9.3f} "
                     f"{r['ttft_p50_ms']:>8.1f}ms {r['ttft_p99_ms']:>8.1f}ms")
    pols = result["policies"]
    if "kv_events" in pols and "oracle" in pols:
        k, o = pols["kv_events"], pols["oracle"]
        ca = pols.get("cache_aware")
        lines.append(f"kv_events vs oracle: {(k['hit_rate'] - o['hit_rate']) * 100:+.1f} pts hit "
                     f"rate, max/mean {k['max_over_mean_load']:.3f}"
                     + (f", TTFT p99 {k['ttft_p99_ms']:.0f} ms vs cache_aware "
                        f"{ca['ttft_p99_ms']:.0f} ms" if ca else ""))
    if "sluice" in result["policies"] and len(result["policies"]) > 1:
        best, rate = best_non_oracle(result)
        s = result["policies"]["sluice"]
        lines.append(f"sluice vs best non-oracle ({best}): {(s['hit_rate'] - rate) * 100:+.1f} pts "
                     f"hit rate, max/mean {s['max_over_mean_load']:.3f}")
    return "\n".join(lines)


def format_draws(result: dict) -> str:
    """``--draws``: each policy's figures over the draws (median [min-max] of TTFT p99,
    hit rate's median, worst max/mean), and how often kv_events' p99 was at or under
    cache_aware's in the same draw."""
    import statistics
    draws = result["draws"]
    n = len(next(iter(draws.values()))["ttft_p99_ms"])
    lines = [f"over {n} draws: draw 0 is the table above, draw k salts every hash key with k",
             "and moves the random seed by k (round_robin and cache_aware hash nothing: one draw)",
             f"{'policy':<16} {'hit rate':>9} {'worst max/mean':>15} "
             f"{'TTFT p99 median [min-max]':>30}"]
    for name, d in draws.items():
        p99 = d["ttft_p99_ms"]
        lines.append(f"{name:<16} {statistics.median(d['hit_rate']):>9.1%} "
                     f"{max(d['max_over_mean_load']):>15.3f} "
                     f"{statistics.median(p99):>11.1f}ms [{min(p99):.1f}-{max(p99):.1f}]")
    if "kv_events" in draws and "cache_aware" in draws:
        k, ca = draws["kv_events"]["ttft_p99_ms"], draws["cache_aware"]["ttft_p99_ms"]
        lines.append(f"kv_events TTFT p99 at or under cache_aware's in "
                     f"{sum(a <= b for a, b in zip(k, ca))} of {n} draws")
    return "\n".join(lines)


PRESETS = ["seed", "deep_tree", "short_sessions", "hot_tenant"]


def preset_rows(preset: str, requests: int, rng_seed: int, rate: float | None = None
                ) -> list[dict]:
    """A preset's workload rows, as ``sim workload`` writes them."""
    from app.replica_routing.workload import seed_workload, shaped_workload
    kwargs = {"seed": rng_seed, **({"rate_rps": rate} if rate else {})}
    return (seed_workload(requests, **kwargs) if preset == "seed"
            else shaped_workload(preset, requests, **kwargs))


@sim_cli.command("prefix-routing")
@click.option("--workload", "workload_path", default=None,
              help="JSON-lines file ('-': stdin); without it, --preset is generated")
@click.option("--preset", type=click.Choice(PRESETS), default="seed", show_default=True,
              help="the workload simulated when no --workload is given (as 'sim workload' "
              "writes it, with --requests and --seed)")
@click.option("--requests", type=click.IntRange(1, 10_000_000), default=20_000,
              show_default=True, help="with --preset")
@click.option("--seed", "rng_seed", type=int, default=28, show_default=True,
              help="with --preset")
@click.option("--replicas", type=click.IntRange(1, 4096), required=True)
@click.option("--kv-tokens", type=click.IntRange(1), default=DEFAULT_KV_TOKENS,
              show_default=True, help="KV-cache tokens per replica (default: an 8B FP8 "
              "model with FP8 KV on an 80 GB H100; 491520 at bf16 KV)")
@click.option("--block-tokens", type=click.IntRange(1), default=16, show_default=True)
@click.option("--concurrency", type=click.IntRange(1), default=32, show_default=True)
@click.option("--prefill-ms-per-token", type=float, default=0.08, show_default=True)
@click.option("--decode-ms-per-token", type=float, default=15.0, show_default=True)
@click.option("--c", "c", type=click.FloatRange(1.0), default=1.25, show_default=True,
              help="bounded-load factor of the sluice policy")
@click.option("--stream-share", type=click.FloatRange(0.0, 1.0), default=1.0,
              show_default=True, help="share of requests that stream: kv_events counts "
              "the prefill a replica has still to do only for those (the gateway sees "
              "their first token)")
@click.option("--policies", default="", help="comma-separated subset (default: all)")
@click.option("--draws", type=click.IntRange(1, 100), default=1, show_default=True,
              help="also run the workload again this many times in all with the hash keys "
              "salted and the random seed moved, and print each policy's spread: a tail "
              "figure of one run is one draw")
@click.option("--record", is_flag=True, help="keep the result for the console's Routing page")
@click.option("--json", "as_json", is_flag=True, help="print JSON only")
def prefix_routing(workload_path, preset, requests, rng_seed, replicas, kv_tokens,
                   block_tokens, concurrency, prefill_ms_per_token, decode_ms_per_token, c,
                   stream_share, policies, draws, record, as_json):
    """Compare replica-choice policies on a workload (hit rate, balance, TTFT): a
    JSON-lines file (``sim workload`` writes one), or a preset generated in place."""
    from app.core.prefix_sim import POLICIES, SimParams, simulate_draws
    names = [p.strip() for p in policies.split(",") if p.strip()] or list(POLICIES)
    unknown = [n for n in names if n not in POLICIES]
    if unknown:
        raise click.BadParameter(f"unknown policy {', '.join(unknown)}; "
                                 f"choose from {', '.join(POLICIES)}", param_hint="--policies")
    params = SimParams(replicas=replicas, kv_tokens=kv_tokens, block_tokens=block_tokens,
                       concurrency=concurrency, prefill_ms_per_token=prefill_ms_per_token,
                       decode_ms_per_token=decode_ms_per_token, bounded_load_c=c,
                       stream_share=stream_share)
    if workload_path is None:   # the rows a written file would hold, exactly
        from app.replica_routing.workload import to_lines
        rows = [json.loads(line) for line in to_lines(preset_rows(preset, requests, rng_seed))]
        source = f"preset {preset}, {requests} requests, seed {rng_seed}"
        if not as_json:
            click.echo(f"workload: {source} (--workload FILE to use your own)", err=True)
    else:
        rows, source = read_workload(workload_path), workload_path
    progress = None if as_json or draws == 1 else (lambda what: click.echo(what, err=True))
    result = simulate_draws(rows, params, names, draws, progress)
    if record:
        from app.replica_routing.service import record_simulation
        record_simulation(result, {"workload": source, "draws": draws, **params.__dict__})
    if as_json:
        click.echo(json.dumps(result))
    else:
        click.echo(format_table(result))
        if "draws" in result:
            click.echo(format_draws(result))


@sim_cli.command("workload")
@click.option("--preset", type=click.Choice(PRESETS), default="seed", show_default=True,
              help="seed: the seed's cohorts; the others: prefix-tree shapes of issue 17")
@click.option("--out", "out_path", default="-", help="file to write ('-': stdout)")
@click.option("--requests", type=click.IntRange(1, 10_000_000), default=20_000,
              show_default=True)
@click.option("--rate", type=click.FloatRange(0.01), default=None,
              help="mean requests/s (default: the seed's Tier-1 share, 25.3)")
@click.option("--seed", "rng_seed", type=int, default=28, show_default=True)
def workload(preset, out_path, requests, rate, rng_seed):
    """Write a workload as JSON lines."""
    from app.replica_routing.workload import to_lines
    rows = preset_rows(preset, requests, rng_seed, rate)
    if out_path == "-":
        for line in to_lines(rows):
            click.echo(line)
        return
    with open(out_path, "w", encoding="utf-8") as fh:
        for line in to_lines(rows):
            fh.write(line + "\n")
    click.echo(f"wrote {len(rows)} requests to {out_path}", err=True)


@drill_cli.command("replica-loss")
@click.option("--url", required=True, help="Gateway base URL, e.g. http://127.0.0.1:8080")
@click.option("--key", required=True, envvar="SLUICE_DRILL_KEY", help="Tenant API key")
@click.option("--pool", "pool_name", required=True, help="Pool behind the tier the key uses")
@click.option("--stop", "stop_count", default=2, show_default=True,
              help="Replicas to take away after the first turns")
@click.option("--sessions", default=8, show_default=True)
@click.option("--turns-before", default=3, show_default=True)
@click.option("--turns-after", default=4, show_default=True)
@click.option("--model", default="auto", show_default=True)
@click.option("--timeout", "timeout_s", default=120.0, show_default=True)
def replica_loss(url, key, pool_name, stop_count, sessions, turns_before, turns_after, model,
                 timeout_s):
    """CD-28C: stop replicas of a live pool mid-load through the pool driver (run it on the
    pool's node); report failed requests, which sessions moved, and the hit rate per turn."""
    from app.errors import ValidationError
    from app.replica_routing.drill_runs import record_replica_loss
    try:
        run = record_replica_loss(url, key, pool_name=pool_name, stop_count=stop_count,
                                  sessions=sessions, turns_before=turns_before,
                                  turns_after=turns_after, model=model, timeout_s=timeout_s)
    except ValidationError as exc:
        raise click.UsageError("; ".join(f"{k}: {', '.join(v)}" for k, v in exc.errors.items()))
    if run.status == "error":
        raise click.ClickException(f"drill #{run.id} failed: {run.result.get('error')}")
    result = run.result
    click.echo(json.dumps(result, indent=2, default=str))
    click.echo(f"drill #{run.id} {run.status}: {result['failed_requests']} failed of "
               f"{result['requests']}, {result['sessions_moved']} sessions moved "
               f"({result['sessions_moved_from_live_replicas']} from live replicas, "
               f"{result.get('live_moves_allowed', 0)} allowed under "
               f"{result.get('replica_choice') or 'rendezvous'}), hit rate "
               f"by turn {[t['hit_rate'] for t in result['turns']]}")


def groups() -> list:
    """Click groups this area adds to ``flask --app wsgi``."""
    return [sim_cli]
