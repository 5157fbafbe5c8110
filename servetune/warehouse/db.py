"""Where the warehouse is: URL resolution (env var or Airflow connection) and engines.

The library never imports Airflow, so an Airflow connection is read the way Airflow itself
exports it to tasks: the ``AIRFLOW_CONN_SERVETUNE_WAREHOUSE`` environment variable, in URI
or JSON form. Passwords are never logged: every message uses ``redact``.
"""

from __future__ import annotations

import os
from urllib.parse import quote, unquote, urlsplit

import orjson
from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import URL, make_url

from servetune.localdb import redact

__all__ = ["AIRFLOW_CONN_ENV", "URL_ENV", "WarehouseConfigError", "engine", "redact", "resolve_url"]

URL_ENV = "SERVETUNE_DATABASE_URL"
AIRFLOW_CONN_ENV = "AIRFLOW_CONN_SERVETUNE_WAREHOUSE"
_POSTGRES_SCHEMES = {"postgres", "postgresql", "postgresql+psycopg", "postgresql+psycopg2"}


class WarehouseConfigError(ValueError):
    """No usable database URL (the message says where we looked and never shows a password)."""


def quote_password(raw: str) -> str:
    """``scheme://user:p@ss@host/db`` -> ``scheme://user:p%40ss@host/db``: a password with a raw ``@``
    (or ``/``, ``?``, ``#``) is everything up to the last ``@``, so the URL parses as meant and no part
    of the password ends up read (and shown) as the host. Already-escaped passwords are unchanged."""
    scheme, sep, rest = raw.partition("://")
    at = rest.rfind("@")
    user, colon, password = rest[:at].partition(":") if at > 0 else ("", "", "")
    if not sep or not colon or "/" in user:
        return raw
    return f"{scheme}://{user}:{quote(unquote(password), safe='')}@{rest[at + 1:]}"


def _from_airflow_uri(uri: str) -> URL:
    parts = urlsplit(quote_password(uri))
    if parts.scheme.replace("-", "_") not in _POSTGRES_SCHEMES:
        raise WarehouseConfigError(
            f"{AIRFLOW_CONN_ENV}: connection type {parts.scheme!r} is not postgres"
        )
    return URL.create(
        "postgresql+psycopg",
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
        host=parts.hostname,
        port=parts.port,
        database=unquote(parts.path.lstrip("/")) or None,
        query={k: v for k, v in _query_pairs(parts.query).items() if not k.startswith("__extra__")},
    )


def _query_pairs(query: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in filter(None, query.split("&")):
        k, _, v = pair.partition("=")
        out[unquote(k)] = unquote(v)
    return out


def _from_airflow_json(text: str) -> URL:
    try:
        conn = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise WarehouseConfigError(f"{AIRFLOW_CONN_ENV}: not valid JSON ({e.msg})") from None
    if not isinstance(conn, dict):
        raise WarehouseConfigError(f"{AIRFLOW_CONN_ENV}: JSON form must be an object")
    conn_type = str(conn.get("conn_type", "postgres")).replace("-", "_")
    if conn_type not in _POSTGRES_SCHEMES:
        raise WarehouseConfigError(f"{AIRFLOW_CONN_ENV}: conn_type {conn_type!r} is not postgres")
    extra = conn.get("extra") or {}
    if isinstance(extra, str):
        extra = orjson.loads(extra) if extra.strip() else {}
    query = {k: str(v) for k, v in extra.items() if k in {"sslmode", "sslrootcert", "application_name"}}
    return URL.create(
        "postgresql+psycopg",
        username=conn.get("login"),
        password=conn.get("password"),
        host=conn.get("host"),
        port=int(conn["port"]) if conn.get("port") else None,
        # Airflow's postgres connection keeps the database name in "schema"
        database=conn.get("schema") or conn.get("database"),
        query=query,
    )


def resolve_url(explicit: str | None = None) -> str:
    """The warehouse URL: an explicit one, ``SERVETUNE_DATABASE_URL``, else the Airflow connection."""
    raw = explicit or os.environ.get(URL_ENV)
    if raw:
        url = make_url(quote_password(raw))
        if url.drivername in {"postgres", "postgresql"}:
            url = url.set(drivername="postgresql+psycopg")
        return url.render_as_string(hide_password=False)
    conn = os.environ.get(AIRFLOW_CONN_ENV, "").strip()
    if conn:
        url = _from_airflow_json(conn) if conn.startswith("{") else _from_airflow_uri(conn)
        return url.render_as_string(hide_password=False)
    raise WarehouseConfigError(
        f"no warehouse database configured: set {URL_ENV} (e.g. postgresql+psycopg://user@host/db), "
        f"pass --database-url, or define the Airflow connection {AIRFLOW_CONN_ENV}"
    )


def engine(url: str | None = None, **kwargs) -> Engine:
    """A SQLAlchemy engine on psycopg 3 (the password stays out of ``repr`` and logs)."""
    kwargs.setdefault("json_serializer", _json_dumps)
    return create_engine(resolve_url(url), pool_pre_ping=True, **kwargs)


def _json_dumps(value: object) -> str:
    """JSONB values: numpy numbers allowed, NaN/inf become null (Postgres JSON has neither)."""
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS).decode()

