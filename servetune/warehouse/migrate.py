"""Alembic, driven from code: the migrations ship inside the package, so no alembic.ini is needed."""

from __future__ import annotations

import functools
import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, inspect

from servetune.warehouse import db
from servetune.warehouse.files import LoadError

MIGRATIONS = Path(__file__).with_name("migrations")
logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)  # one INFO line per plugin: noise


def alembic_config(url: str | None = None) -> Config:
    """Alembic's config; ``url`` (already resolved) only for Alembic's own CLI-style use."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    if url:
        # "%" is ConfigParser interpolation syntax: escape it so passwords with "%" survive
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def _run(fn, url: str | None, revision: str, check=None) -> None:
    """Alembic's ``fn`` in one transaction on one engine; ``check(conn)`` first, in the same connection."""
    cfg = alembic_config()
    eng = db.engine(url)
    try:
        with eng.begin() as conn:
            if check is not None:
                check(conn)
            cfg.attributes["connection"] = conn
            fn(cfg, revision)
    finally:
        eng.dispose()


def _read(url: str | None, fn):
    """``fn(conn)`` on a connection of its own engine, disposed after."""
    eng = db.engine(url)
    try:
        with eng.connect() as conn:
            return fn(conn)
    finally:
        eng.dispose()


def upgrade(url: str | None = None, revision: str = "head") -> None:
    """Migrate up to ``revision``; a database that is someone else's (tables, no revision) is refused."""
    _run(command.upgrade, url, revision, check=check_foreign)


def schema_problem(url: str | None) -> str | None:
    """Why a query against this warehouse failed, when its schema is the reason (behind, ahead, foreign or
    never migrated); None when the schema is this servetune's or the database cannot be asked."""
    try:
        _read(url, check_schema)
    except SchemaMismatch as exc:
        return str(exc)
    except Exception:  # noqa: BLE001 - a diagnosis only: the original error is reported instead
        return None
    return None


def downgrade(url: str | None = None, revision: str = "-1") -> None:
    _run(command.downgrade, url, revision)


def current(url: str | None = None) -> str | None:
    """The database's revision (None: never migrated)."""
    return _read(url, lambda conn: MigrationContext.configure(conn).get_current_revision())


@functools.cache
def head() -> str:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


@functools.cache
def _known() -> frozenset[str]:
    return frozenset(r.revision for r in ScriptDirectory.from_config(alembic_config()).walk_revisions())


class SchemaMismatch(LoadError):
    """The warehouse's schema is not the one this servetune writes: behind, ahead, foreign or never migrated."""


def check_foreign(conn: Connection) -> None:
    """A database that holds tables but no servetune revision is someone else's: SchemaMismatch, so neither a
    load nor ``db upgrade`` writes servetune's tables beside theirs."""
    if MigrationContext.configure(conn).get_current_revision() is not None:
        return
    tables = [t for t in inspect(conn).get_table_names() if t != "alembic_version"]
    if tables:
        raise SchemaMismatch(f"the database holds {len(tables)} table(s) ({', '.join(sorted(tables)[:3])}, ...)"
                             " but no servetune revision: not a servetune warehouse; point at another database")


def check_schema(conn: Connection) -> None:
    """Before any write: the warehouse is at this servetune's head revision, else SchemaMismatch in one line
    saying which way it is off and what to run (a newer warehouse is never written by older code)."""
    at = MigrationContext.configure(conn).get_current_revision()
    if at == head():
        return
    if at is None:
        check_foreign(conn)
        raise SchemaMismatch("the warehouse was never migrated: run `servetune db upgrade`")
    if at not in _known():
        raise SchemaMismatch(f"the warehouse is at revision {at}, newer than this servetune's {head()}: upgrade"
                             " servetune (writing with older code would miss the newer columns)")
    raise SchemaMismatch(f"the warehouse is at revision {at}, behind this servetune's {head()}:"
                         " run `servetune db upgrade`")
