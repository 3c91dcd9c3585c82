"""``flask --app wsgi engine serve ...``: the reference engine from the Flask CLI."""
from __future__ import annotations

import click


@click.group("engine", help="CPU reference engine (vLLM's OpenAI-compatible API)")
def engine_cli() -> None:
    pass


@engine_cli.command("serve", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def serve(args: tuple[str, ...]) -> None:
    """Same options as ``python -m app.engine`` (--model, --served-model-name, --port ...)."""
    from app.engine.__main__ import main
    raise SystemExit(main(list(args)))


@engine_cli.command("convert")
def convert() -> None:
    """Convert the packaged SmolLM2 GGUF into the cached HF folder once."""
    from app.engine.model import ensure_smollm2
    click.echo(str(ensure_smollm2()))


def groups() -> list:
    """Click groups this area adds to ``flask --app wsgi``."""
    return [engine_cli]
