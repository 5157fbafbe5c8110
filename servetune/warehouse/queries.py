"""Named queries: the psql-ready files in ``sql/queries/`` (packaged here), run with bound parameters.

A file declares its parameters in its header (``-- @param name type [= default]  help``) and uses
them as psql variables (``:'name'``). Here each ``:'name'`` becomes a bind parameter; values are
never pasted into the SQL text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

from servetune.warehouse import db

QUERIES_DIR = Path(__file__).with_name("sql") / "queries"
_PARAM = re.compile(r"^--\s*@param\s+(\w+)\s+(text|int|float)(?:\s*=\s*('[^']*'|\S+))?\s*(.*)$")
_PSQL_VAR = re.compile(r":'(\w+)'")
_CASTS = {"text": str, "int": int, "float": float}


class QueryError(ValueError):
    """Unknown query, missing or malformed parameter (the message names it)."""


@dataclass(frozen=True)
class Param:
    name: str
    type: str
    default: str | None  # None: required
    help: str


@dataclass(frozen=True)
class NamedQuery:
    name: str
    path: Path
    description: str
    params: tuple[Param, ...]
    sql: str

    def bind(self, given: dict[str, str]) -> dict[str, str]:
        """Check and complete the parameters: all known, all present, each parses as its type."""
        known = {p.name: p for p in self.params}
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise QueryError(f"{self.name}: unknown parameter(s) {', '.join(unknown)} "
                             f"(takes: {', '.join(known) or 'none'})")
        values: dict[str, str] = {}
        for p in self.params:
            value = given.get(p.name, p.default)
            if value is None:
                raise QueryError(f"{self.name}: parameter {p.name!r} ({p.type}) is required: --param {p.name}=...")
            try:
                _CASTS[p.type](value)
            except ValueError:
                raise QueryError(f"{self.name}: parameter {p.name}={value!r} is not a valid {p.type}") from None
            values[p.name] = value  # bound as text; the SQL casts it, exactly as under psql
        return values


def _parse(path: Path) -> NamedQuery:
    sql = path.read_text()
    params, description = [], ""
    for line in sql.splitlines():
        if not line.startswith("--"):
            break
        m = _PARAM.match(line)
        if m:
            name, typ, default, help_ = m.groups()
            if default is not None and default.startswith("'"):
                default = default[1:-1]
            params.append(Param(name, typ, default, help_.strip()))
        elif not description and not line.lstrip("- ").startswith(("psql:", "@")):
            description = line.lstrip("- ").strip()
    used = set(_PSQL_VAR.findall(sql))
    declared = {p.name for p in params}
    if used != declared:
        raise QueryError(f"{path}: parameters used {sorted(used)} differ from declared {sorted(declared)}")
    return NamedQuery(path.stem, path, description, tuple(params), sql)


def available() -> dict[str, NamedQuery]:
    return {q.name: q for q in (_parse(p) for p in sorted(QUERIES_DIR.glob("*.sql")))}


def get(name: str) -> NamedQuery:
    queries = available()
    if name not in queries:
        raise QueryError(f"no query named {name!r}; available: {', '.join(queries)}")
    return queries[name]


def run(name: str, params: dict[str, str] | None = None, *, engine: Engine | None = None,
        database_url: str | None = None) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run a named query; returns (column names, rows)."""
    query = get(name)
    values = query.bind(params or {})
    statement = text(_PSQL_VAR.sub(lambda m: f":{m.group(1)}", query.sql))
    eng = engine or db.engine(database_url)
    try:
        with eng.connect() as conn:
            result = conn.execute(statement, values)
            return list(result.keys()), [tuple(r) for r in result]
    finally:
        if engine is None:
            eng.dispose()


def known_models(*, database_url: str | None = None) -> list[str]:
    """The models the warehouse has experiments of: what a query that found none for a model names."""
    eng = db.engine(database_url)
    try:
        with eng.connect() as conn:
            return [r[0] for r in conn.execute(text("SELECT DISTINCT model FROM experiments ORDER BY model"))]
    finally:
        eng.dispose()
