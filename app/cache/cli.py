"""``flask --app wsgi drill cache-poisoning --pairs FILE [--json] [--threshold X]``."""
from __future__ import annotations

import json

import click

from app.drills.cli import drill_cli


def groups() -> list:
    return []


@drill_cli.command("cache-poisoning")
@click.option("--pairs", "pairs_path", required=True, type=click.Path(exists=True, dir_okay=False),
              help='JSONL lines {"a", "b", "same", "kind"}')
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object")
@click.option("--threshold", type=click.FloatRange(0.0, 1.0), default=None,
              help="Cosine threshold (default: the policy default)")
@click.option("--static", is_flag=True,
              help="Word-for-word guard at the threshold only, no verifier (the cache before "
                   "issue 22)")
def cache_poisoning(pairs_path: str, as_json: bool, threshold: float | None, static: bool) -> None:
    """CD-28A: store each a, probe with b; report false and true hits per kind."""
    from app.cache.drill import PairError
    from app.cache.drill_runs import record_cache_poisoning
    try:
        with open(pairs_path, encoding="utf-8") as fh:
            result = record_cache_poisoning(fh, threshold=threshold, source=pairs_path,
                                            verified=not static).result
    except PairError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps({k: result[k] for k in ("pairs", "false_hits", "false_hit_rate",
                                                      "true_hits", "true_hit_rate", "by_kind")}))
        return
    click.echo(f"pairs {result['pairs']}  false hits {result['false_hits']} "
               f"({result['false_hit_rate']:.2%})  true hits {result['true_hits']} "
               f"({result['true_hit_rate']:.2%})")
    for kind, k in result["by_kind"].items():
        click.echo(f"  {kind:<14} pairs {k['pairs']:>4}  hits {k['hits']:>4}  "
                   f"false {k['false_hits']:>3}  true {k['true_hits']:>4}")
