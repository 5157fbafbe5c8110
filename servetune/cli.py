"""The ``servetune`` command. Each command group lives in its own module; this file only wires them."""

from __future__ import annotations

import logging

import typer

app = typer.Typer(
    name="servetune",
    help="Controlled, complete and comparable benchmarks and tuning for LLM serving engines.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


@app.callback()
def _main(verbose: bool = typer.Option(False, "--verbose", "-v", help="debug logging")) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from servetune.redact import install_log_redaction

    install_log_redaction()  # every log line of every module, whatever it formats


@app.command()
def version() -> None:
    """Print servetune's version."""
    from servetune import __version__

    typer.echo(__version__)


def _register() -> None:
    from importlib import import_module

    for name in (
        # --- command modules: one line each ---
        "bench",
        "report",
        "history",
        "tune",
        "db",
        "load",
        "validate",
        "query",
        "sim",
        "serve",
        "airflow",
        # --- end command modules ---
    ):
        import_module(f"servetune.commands.{name}").register(app)


_register()

if __name__ == "__main__":
    app()
