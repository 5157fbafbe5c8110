"""servetune.warehouse: the Postgres result warehouse (tables, migrations, loader, named queries).

The loader (psycopg, SQLAlchemy) is imported on first use: the checklist reads the table layout from
``servetune.warehouse.tables`` and must not need a database driver to run beside a GPU runner."""

from __future__ import annotations

from typing import Any

__all__ = ["LoadReport", "TrialLoad", "load_result"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from servetune.warehouse import loader

        return getattr(loader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
