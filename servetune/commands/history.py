"""``servetune history``: a model's past experiments from the warehouse, with trend arrows."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

import typer
from rich.console import Console

from servetune.commands.db import DatabaseUrl, warehouse_errors
from servetune.commands.jsonout import JsonFlag, use_json


def register(app: typer.Typer) -> None:
    @app.command("history")
    def history(
        model: Annotated[str, typer.Option("--model", help="the model name experiments were run for")],
        limit: Annotated[int, typer.Option("--limit", min=1, help="most recent experiments to show")] = 20,
        database_url: DatabaseUrl = None,
        json_out: JsonFlag = False,
    ) -> None:
        """Past experiments for MODEL, newest first: ceiling, recommended config, goodput, hit rate, trends."""
        as_json = use_json(json_out)
        from servetune.logs import emit_json
        from servetune.report.history import fetch_history, print_history

        with warehouse_errors("history", database_url):
            entries = fetch_history(model, database_url=database_url, limit=limit)
        if as_json:  # the entries, newest first (the config already redacted); [] for an unknown model
            emit_json([asdict(e) for e in entries])
            return
        print_history(model, entries, Console())
