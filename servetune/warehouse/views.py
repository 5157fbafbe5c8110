"""The SQL views (``sql/views/*.sql``, packaged here) and how migrations (re)create them.

Views are "replaceable objects": migrations drop and recreate all of them from the current files,
because ``accepted_trials`` selects ``trials.*`` and must follow every column change.
"""

from __future__ import annotations

import re
from pathlib import Path

from sqlalchemy import Connection

VIEWS_DIR = Path(__file__).with_name("sql") / "views"
_VIEW_NAME = re.compile(r"CREATE\s+OR\s+REPLACE\s+VIEW\s+(\w+)", re.IGNORECASE)
_NEEDS = re.compile(r"^-- needs column: (\w+)\.(\w+)$", re.MULTILINE)  # a view over columns a later migration adds


def view_files() -> list[Path]:
    return sorted(VIEWS_DIR.glob("*.sql"))


def view_names() -> list[str]:
    """Every view, in creation order (dependencies first)."""
    return [name for f in view_files() for name in _VIEW_NAME.findall(f.read_text())]


def drop_views(conn: Connection) -> None:
    for name in reversed(view_names()):
        conn.exec_driver_sql(f'DROP VIEW IF EXISTS "{name}"')  # names come from our own files


def create_views(conn: Connection) -> None:
    """Every view whose columns exist: an older migration run up or down skips a view over newer columns."""
    raw = conn.connection.driver_connection  # psycopg: no parameters, so "%" in comments is literal
    with raw.cursor() as cur:
        for f in view_files():
            text = f.read_text()
            needs = _NEEDS.findall(text)
            if needs:
                cur.execute("SELECT count(*) FROM information_schema.columns WHERE table_schema = current_schema()"
                            " AND (table_name, column_name) IN (SELECT * FROM unnest(%s::text[], %s::text[]))",
                            ([t for t, _ in needs], [c for _, c in needs]))
                if cur.fetchone()[0] < len(set(needs)):
                    continue
            cur.execute(text)


def recreate_views(conn: Connection) -> None:
    drop_views(conn)
    create_views(conn)
