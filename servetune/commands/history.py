"""``servetune history``: a model's past experiments from the warehouse, with trend arrows."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from servetune.commands.db import DatabaseUrl, warehouse_errors


def register(app: typer.Typer) -> None:
    @app.command("history")
    def history(
        model: Annotated[str, typer.Option("--model", help="the model name experiments were run for")],
        limit: Annotated[int, typer.Option("--limit", min=1, help="most recent experiments to show")] = 20,
        database_url: DatabaseUrl = None,
    ) -> None:
        """Past experiments for MODEL, newest first: ceiling, recommended config, goodput, hit rate, trends."""
        from servetune.report.history import fetch_history, print_history

        with warehouse_errors("history"):
            entries = fetch_history(model, database_url=database_url, limit=limit)
        print_history(model, entries, Console())
