"""CLI commands of this area: ``flask --app wsgi minify report --cases FILE [--json]``."""
from __future__ import annotations

import json

import click
from flask.cli import AppGroup

from app.core.minify_alias import ALIAS_STYLES
from app.contract.tokenizers import TOKENIZERS
from app.contract.policy import DEFAULTS

minify_cli = AppGroup("minify", help="Schema key minification (S02/S05).")


@minify_cli.command("report")
@click.option("--cases", "cases_file", required=True, type=click.File("r", encoding="utf-8"),
              help='JSON lines: {"schema": <JSON schema>, "output": <object valid under it>}')
@click.option("--json", "as_json", is_flag=True, help="Print the totals as one JSON object.")
@click.option("--tokenizer", default="cl100k_base", show_default=True,
              type=click.Choice(TOKENIZERS))
@click.option("--minify-enums/--no-minify-enums", default=DEFAULTS["minify_enums"],
              show_default=True,
              help="Also alias multi-token enum values (the policy's minify_enums).")
@click.option("--alias-style", default=DEFAULTS["minify_alias_style"], show_default=True,
              type=click.Choice(ALIAS_STYLES),
              help="Key aliases: words of each key or letters (the policy's minify_alias_style).")
@click.option("--baseline", type=click.Choice(["compact", "spaced"]), default="compact",
              show_default=True,
              help="How the original output is counted: compact (the keys' saving alone) or "
                   "spaced, as a grammar engine writes it without Sluice (', ' ': '; the "
                   "saving on a pool tier with minify_compact_json).")
def report(cases_file, as_json: bool, tokenizer: str, minify_enums: bool,
           alias_style: str, baseline: str) -> None:
    """Output tokens with original vs minified keys (the minified output as compact JSON),
    and whether expand(minify(output)) round-trips exactly."""
    from app.core.minify import MinifyOptions
    from app.minify.report import COMPACT, SPACED, read_cases, report_case, summarise

    try:
        cases = read_cases(cases_file)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--cases") from exc
    options = MinifyOptions(minify_enums=minify_enums, alias_style=alias_style)
    separators = SPACED if baseline == "spaced" else COMPACT
    reports = [report_case(n, case, tokenizer, options, separators) for n, case in cases]
    totals = summarise(reports)
    if as_json:
        click.echo(json.dumps(totals))
        return
    click.echo(f"tokenizer {tokenizer}, {alias_style} aliases; original output counted "
               f"{baseline}, minified output compact")
    for r in reports:
        click.echo(f"line {r.line:>3} {r.name[:40]:<40} {r.tokens_before:>5} -> "
                   f"{r.tokens_after:>5} tokens ({r.reduction:6.1%})  keys renamed "
                   f"{r.renamed_keys:>3}"
                   f"{f'  values renamed {r.renamed_values:>3}' if minify_enums else ''}"
                   f"  roundtrip {'ok' if r.roundtrip_ok else 'FAIL'}"
                   f"{'' if r.valid_minified else '  minified output INVALID'}")
    click.echo(f"total {totals['cases']} cases: {totals['tokens_before']} -> "
               f"{totals['tokens_after']} tokens ({totals['reduction']:.1%} fewer); "
               f"roundtrip {'ok' if totals['roundtrip_ok'] else 'FAIL'}")
    if not totals["roundtrip_ok"]:
        raise SystemExit(1)


def groups() -> list:
    """Click groups this area adds to ``flask --app wsgi``."""
    return [minify_cli]
