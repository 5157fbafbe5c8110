"""``servetune query NAME --param k=v``: the example queries of sql/queries/, with bound parameters."""

from __future__ import annotations

import csv
import sys
from datetime import date, datetime
from decimal import Decimal
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from servetune.commands.db import BAD_INPUT, DatabaseUrl, warehouse_errors
from servetune.commands.jsonout import JsonFlag, use_json


def _plain(v: Any) -> Any:
    if isinstance(v, Decimal):
        return float(v)
    if isinstance(v, (date, datetime)):
        return v.isoformat()
    return v


def register(app: typer.Typer) -> None:
    @app.command("query")
    def query(
        name: Annotated[str | None, typer.Argument(help="query name (a file in sql/queries/); omit to list")] = None,
        param: Annotated[list[str] | None, typer.Option("--param", "-p", help="k=v, repeatable")] = None,
        fmt: Annotated[str, typer.Option("--format", "-f", help="table | csv | json (--json: json)")] = "table",
        database_url: DatabaseUrl = None,
        json_out: JsonFlag = False,
    ) -> None:
        """Run a named history query (e.g. ceiling_last_month --param model=llama-8b)."""
        as_json = use_json(json_out)
        from servetune.logs import emit_json
        from servetune.warehouse import queries

        err = Console(stderr=True, soft_wrap=True, highlight=False)  # one unwrapped line per error
        fmt = "json" if as_json else fmt  # --json: the rows as one JSON document, as -f json
        if name is None and fmt == "json":
            emit_json([{"name": q.name, "description": q.description,
                        "parameters": [{"name": p.name, "default": p.default} for p in q.params]}
                       for q in queries.available().values()])
            return
        if name is None:
            table = Table(title="queries (sql/queries/)")
            for col in ("name", "parameters", "what"):
                table.add_column(col)
            for q in queries.available().values():
                ps = ", ".join(p.name + (f"={p.default!r}" if p.default is not None else "") for p in q.params)
                table.add_row(q.name, ps, q.description)
            Console().print(table)
            return
        if fmt not in {"table", "csv", "json"}:
            err.print(f"[red]query:[/red] --format must be table, csv or json, not {escape(repr(fmt))}")
            raise typer.Exit(BAD_INPUT)
        given: dict[str, str] = {}
        for item in param or []:
            key, sep, value = item.partition("=")
            if not sep or not key:
                err.print(f"[red]query:[/red] --param expects k=v, got {escape(repr(item))}")
                raise typer.Exit(BAD_INPUT)
            given[key.strip()] = value
        with warehouse_errors("query", database_url):
            columns, rows = queries.run(name, given, database_url=database_url)
            if not rows and "model" in given:  # a model named otherwise: say which ones the warehouse knows
                known = queries.known_models(database_url=database_url)
                err.print(f"query {name}: no rows for model {escape(repr(given['model']))}; the warehouse knows: "
                          + (", ".join(escape(m) for m in known) or "no model yet"))
        if fmt == "json":
            sys.stdout.write(orjson.dumps([dict(zip(columns, map(_plain, r), strict=True)) for r in rows],
                                          option=orjson.OPT_INDENT_2).decode() + "\n")
        elif fmt == "csv":
            w = csv.writer(sys.stdout)
            w.writerow(columns)
            w.writerows([[_plain(v) for v in r] for r in rows])
        else:
            table = Table(title=f"{name} ({len(rows)} rows)")
            for c in columns:
                table.add_column(c)
            for r in rows:
                table.add_row(*["" if v is None else str(_plain(v)) for v in r])
            Console().print(table)
