"""Alembic, driven from code: the migrations ship inside the package, so no alembic.ini is needed."""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from servetune.warehouse import db

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


def _run(fn, url: str | None, revision: str) -> None:
    cfg = alembic_config()
    eng = db.engine(url)
    try:
        with eng.begin() as conn:
            cfg.attributes["connection"] = conn
            fn(cfg, revision)
    finally:
        eng.dispose()


def upgrade(url: str | None = None, revision: str = "head") -> None:
    _run(command.upgrade, url, revision)


def downgrade(url: str | None = None, revision: str = "-1") -> None:
    _run(command.downgrade, url, revision)


def current(url: str | None = None) -> str | None:
    """The database's revision (None: never migrated)."""
    eng = db.engine(url)
    try:
        with eng.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        eng.dispose()


def head() -> str:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()
