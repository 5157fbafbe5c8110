"""``servetune history``: a model's past experiments from the warehouse, with trend arrows."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

BAD_INPUT = 2


def register(app: typer.Typer) -> None:
    @app.command("history")
    def history(
        model: Annotated[str, typer.Option("--model", help="the model name experiments were run for")],
        limit: Annotated[int, typer.Option("--limit", min=1, help="most recent experiments to show")] = 20,
        database_url: Annotated[str | None, typer.Option(
            "--database-url", help="warehouse URL (default: SERVETUNE_DATABASE_URL, else the Airflow "
            "connection AIRFLOW_CONN_SERVETUNE_WAREHOUSE)")] = None,
    ) -> None:
        """Past experiments for MODEL, newest first: ceiling, recommended config, goodput, hit rate, trends."""
        from sqlalchemy.exc import OperationalError, ProgrammingError

        from servetune.report.history import fetch_history, print_history
        from servetune.warehouse.db import WarehouseConfigError

        err = Console(stderr=True)
        try:
            entries = fetch_history(model, database_url=database_url, limit=limit)
        except WarehouseConfigError as exc:
            err.print(f"[red]history:[/red] {escape(str(exc))}", soft_wrap=True)
            raise typer.Exit(BAD_INPUT) from None
        except (OperationalError, ProgrammingError) as exc:
            err.print(escape(f"history: warehouse not reachable or not migrated: {exc.orig}".splitlines()[0]),
                      style="red", soft_wrap=True)
            raise typer.Exit(BAD_INPUT) from None
        print_history(model, entries, Console())
