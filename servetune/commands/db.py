"""``servetune db upgrade|downgrade|current``: the warehouse schema, through the packaged Alembic migrations.

Also the pieces the other warehouse commands share: the ``--database-url`` option and the way a
configuration or connection error becomes a one-line message (never a password) and exit code 2.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from servetune.commands.jsonout import JsonFlag, use_json

BAD_INPUT = 2
# before alembic is imported (lazily, by a command): it logs one INFO line per plugin as it loads
logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)

DatabaseUrl = Annotated[str | None, typer.Option(
    "--database-url",
    help="warehouse URL (default: SERVETUNE_DATABASE_URL, else the Airflow connection "
         "AIRFLOW_CONN_SERVETUNE_WAREHOUSE in URI or JSON form)")]


@contextmanager
def warehouse_errors(command: str, database_url: str | None = None) -> Iterator[None]:
    """Known failures -> one red line on stderr and exit 2; the URL is shown redacted only. A warehouse
    that is down, frozen or past a timeout says where and which bound (servetune.warehouse.db); a query
    that fails on a warehouse whose schema is not this servetune's says which way it is off."""
    from alembic.util import CommandError
    from sqlalchemy.exc import OperationalError, ProgrammingError

    from servetune.warehouse import migrate
    from servetune.warehouse.db import WarehouseConfigError, WarehouseUnavailable
    from servetune.warehouse.loader import LoadError
    from servetune.warehouse.queries import QueryError

    err = Console(stderr=True)
    try:
        yield
    except (WarehouseConfigError, WarehouseUnavailable, LoadError, QueryError) as exc:
        err.print(f"[red]{command}:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(BAD_INPUT) from None
    except CommandError as exc:  # Alembic: an unknown revision, a bad target
        err.print(f"[red]{command}:[/red] {escape(str(exc).splitlines()[0])} (servetune's newest revision is "
                  f"{migrate.head()}; `servetune db current` shows the warehouse's)", soft_wrap=True)
        raise typer.Exit(BAD_INPUT) from None
    except (OperationalError, ProgrammingError) as exc:
        first = str(exc.orig).splitlines()[0] if exc.orig is not None else str(exc).splitlines()[0]
        why = migrate.schema_problem(database_url) if isinstance(exc, ProgrammingError) else None
        err.print(f"[red]{command}:[/red] {escape(why)}" if why else f"[red]{command}:[/red] warehouse not reachable"
                  f" or not migrated (run `servetune db upgrade`): {escape(first)}", soft_wrap=True)
        raise typer.Exit(BAD_INPUT) from None


def _revision(database_url: str | None, revision: str | None = None) -> None:
    """A db command's answer: the warehouse (password redacted), its revision and servetune's newest one;
    ``--json``: the same as one document."""
    from servetune.logs import emit_json, json_mode
    from servetune.warehouse import db, migrate

    url = db.redact(db.resolve_url(database_url))
    at = migrate.current(database_url)
    if json_mode():
        emit_json({"database": url, "revision": at, "head": migrate.head()})
    elif revision == "current":
        typer.echo(f"{url}: at {at or 'base'} (head {migrate.head()})")
    else:
        typer.echo(f"{url}: at revision {at or 'base'}")


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="The warehouse schema (Alembic migrations shipped with servetune).",
                        no_args_is_help=True)

    @group.command("upgrade")
    def upgrade(
        revision: Annotated[str, typer.Argument(help="target revision")] = "head",
        database_url: DatabaseUrl = None,
        json_out: JsonFlag = False,
    ) -> None:
        """Create or migrate the warehouse tables and views up to REVISION."""
        use_json(json_out)
        from servetune.warehouse import migrate

        with warehouse_errors("db upgrade"):
            migrate.upgrade(database_url, revision)
            _revision(database_url)

    @group.command("downgrade")
    def downgrade(
        revision: Annotated[str, typer.Argument(help="target revision: -1, a revision id, or base")] = "-1",
        database_url: DatabaseUrl = None,
        yes: Annotated[bool, typer.Option("--yes", help="confirm dropping tables (downgrade to base)")] = False,
        json_out: JsonFlag = False,
    ) -> None:
        """Migrate the warehouse down to REVISION (``base`` drops everything and needs --yes)."""
        use_json(json_out)
        from servetune.warehouse import migrate

        if revision == "base" and not yes:
            Console(stderr=True).print("[red]db downgrade:[/red] downgrading to base drops every table "
                                       "and its data; add --yes to confirm", soft_wrap=True)
            raise typer.Exit(BAD_INPUT)
        with warehouse_errors("db downgrade"):
            migrate.downgrade(database_url, revision)
            _revision(database_url)

    @group.command("current")
    def current(database_url: DatabaseUrl = None, json_out: JsonFlag = False) -> None:
        """Print the warehouse's revision and the newest one servetune ships."""
        use_json(json_out)
        with warehouse_errors("db current"):
            _revision(database_url, "current")

    app.add_typer(group, name="db")
