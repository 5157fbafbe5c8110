"""Where the warehouse is: URL resolution (env var or Airflow connection) and engines.

The library never imports Airflow, so an Airflow connection is read the way Airflow itself
exports it to tasks: the ``AIRFLOW_CONN_SERVETUNE_WAREHOUSE`` environment variable, in URI
or JSON form. Passwords are never logged: every message uses ``redact``.

Engines never wait without bound: libpq's ``connect_timeout``, the server-side
``statement_timeout`` and ``lock_timeout``, and the client-side ``response_timeout`` have defaults
(``DEFAULT_TIMEOUTS``), overridden by the ``SERVETUNE_DB_*_TIMEOUT`` variables, overridden in turn by
the URL's query (``?connect_timeout=5``). The server's own bounds cannot fire in a server that is frozen
(SIGSTOPped, a hung host) while the kernel still takes our bytes, so every round trip is also bounded
here (``response_timeout``: by default ``statement_timeout`` + 30 s). A stopped or frozen Postgres, a
statement or a lock wait past its bound is one ``WarehouseUnavailable`` naming host, port and
database (never the password).
"""

from __future__ import annotations

import math
import os
import re
from urllib.parse import quote, unquote, urlsplit

import orjson
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, OperationalError

from servetune.localdb import redact
from servetune.warehouse.bounded import NoAnswer, bounded_connect

__all__ = ["AIRFLOW_CONN_ENV", "URL_ENV", "WarehouseConfigError", "WarehouseUnavailable", "engine", "redact",
           "resolve_url"]

URL_ENV = "SERVETUNE_DATABASE_URL"
AIRFLOW_CONN_ENV = "AIRFLOW_CONN_SERVETUNE_WAREHOUSE"
_POSTGRES_SCHEMES = {"postgres", "postgresql", "postgresql+psycopg", "postgresql+psycopg2"}


#: seconds; 0 waits forever (libpq, Postgres, and here)
DEFAULT_TIMEOUTS = {"connect_timeout": 10.0, "statement_timeout": 300.0, "lock_timeout": 30.0,
                    "response_timeout": 330.0}
RESPONSE_GRACE_S = 30.0  # the default response_timeout: the server's statement_timeout, plus this
TIMEOUT_ENV = {"connect_timeout": "SERVETUNE_DB_CONNECT_TIMEOUT",
               "statement_timeout": "SERVETUNE_DB_STATEMENT_TIMEOUT",
               "lock_timeout": "SERVETUNE_DB_LOCK_TIMEOUT",
               "response_timeout": "SERVETUNE_DB_RESPONSE_TIMEOUT"}
TIMEOUT_KEYS = tuple(DEFAULT_TIMEOUTS)
_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|min|h)?\s*")
_UNIT_S = {"ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, None: 1.0}


class WarehouseConfigError(ValueError):
    """No usable database URL (the message says where we looked and never shows a password)."""


class WarehouseUnavailable(OperationalError):
    """The warehouse did not answer within a bound, or went away: one line naming where, and which bound."""

    def __init__(self, message: str, orig: BaseException | None = None) -> None:
        super().__init__(None, None, orig)  # type: ignore[arg-type]
        self.message = message

    def __str__(self) -> str:
        return self.message


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
    keep = {"sslmode", "sslrootcert", "application_name", "options", *TIMEOUT_KEYS}
    query = {k: str(v) for k, v in extra.items() if k in keep}
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
        where = "--database-url" if explicit else URL_ENV
        try:
            url = make_url(quote_password(raw))
            url.port  # noqa: B018 - a port that is not a number fails here, not at connect
        except (ArgumentError, ValueError) as exc:
            why = "its port is not a number" if "int()" in str(exc) else "not a database URL"
            raise WarehouseConfigError(f"{where}: {redact(raw)!r}: {why} "
                                       "(e.g. postgresql+psycopg://user@host:5432/db)") from None
        if url.drivername.split("+")[0] not in {"postgres", "postgresql"}:
            raise WarehouseConfigError(f"{where}: {url.drivername}:// is not PostgreSQL: the warehouse needs "
                                       "postgresql+psycopg://user@host:5432/db")
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


def engine(url: str | None = None, *, check: bool = True, **kwargs) -> Engine:
    """A SQLAlchemy engine on psycopg 3 (the password stays out of ``repr`` and logs), with connect,
    statement and lock timeouts (timeouts.py). ``check`` connects once now, so a warehouse that is
    down fails here with one ``WarehouseUnavailable``, not once per trial of a load."""
    resolved, connect_args, limits = with_timeouts(make_url(resolve_url(url)))
    kwargs.setdefault("json_serializer", _json_dumps)
    kwargs["connect_args"] = {**connect_args, **kwargs.get("connect_args", {})}
    eng = create_engine(resolved, pool_pre_ping=True, **kwargs)
    if limits.get("response_timeout"):
        event.listen(eng, "do_connect", bounded_connect(limits["response_timeout"]))
    event.listen(eng, "handle_error", explain_errors(resolved, limits), retval=True)
    if check:
        with eng.connect():
            pass
    return eng


def _seconds(value: str, source: str) -> float:
    """``30``, ``2.5``, ``250ms``, ``30s``, ``5min``, ``1h`` -> seconds (a bare number is seconds)."""
    m = _DURATION.fullmatch(str(value))
    if m is None:
        raise WarehouseConfigError(
            f"{source}: {value!r} is not a duration (seconds, or 250ms / 30s / 5min / 1h)")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def timeouts(url: URL) -> dict[str, float]:
    """The bounds in seconds for ``url``: its query, else the environment, else ``DEFAULT_TIMEOUTS``."""
    out = {}
    for key, default in DEFAULT_TIMEOUTS.items():
        raw, env = url.query.get(key), TIMEOUT_ENV[key]
        if isinstance(raw, tuple):
            raw = raw[-1]
        if raw is not None:
            out[key] = _seconds(raw, f"database URL ?{key}=")
        elif os.environ.get(env, "").strip():
            out[key] = _seconds(os.environ[env], env)
        elif key == "response_timeout":  # after the statement's own bound, which a live server enforces
            statement = out["statement_timeout"]
            out[key] = statement + RESPONSE_GRACE_S if statement > 0 else 0.0
        else:
            out[key] = default
    return out


def with_timeouts(url: URL) -> tuple[URL, dict[str, object], dict[str, float]]:
    """``url`` without our keys, the connect arguments that carry the bounds, and the bounds.

    The server-side ones travel in libpq's ``options`` (``-c statement_timeout=...``): set at
    connection start, no extra round trip; options already in the URL come after ours and win."""
    if not url.drivername.startswith("postgresql"):
        return url, {}, {}
    limits = timeouts(url)
    query = {k: v for k, v in url.query.items() if k not in (*TIMEOUT_KEYS, "options")}
    args: dict[str, object] = {"connect_timeout": math.ceil(limits["connect_timeout"])}
    options = [f"-c {key}={round(limits[key] * 1000)}" for key in ("statement_timeout", "lock_timeout")
               if limits[key] > 0]
    theirs = url.query.get("options")
    options += list(theirs) if isinstance(theirs, tuple) else [theirs] if theirs else []
    if options:
        args["options"] = " ".join(options)
    return url.set(query=query), args, limits


def _where(url: URL) -> str:
    host = url.host or url.query.get("host") or "local socket"
    return f"{host}:{url.port or 5432}/{url.database or ''}"


_SERVER_PREFIX = re.compile(r'^(?:connection failed: )?connection to server (?:at|on) "[^"]*"(?: \([^)]*\))?'
                            r'(?:, port \d+)? failed: ')


#: psycopg's words when the other end speaks some other protocol (an HTTP server answers "H...")
_NOT_POSTGRES = re.compile(r"invalid response to SSL negotiation|expected authentication request from server")


def _listens(url: URL) -> bool:
    """Does something accept a TCP connection at the URL's host and port (within a second)? Tells a port that
    takes connections and stays silent from one nobody listens on."""
    import socket

    if not url.host or url.host.startswith("/"):
        return False
    try:
        with socket.create_connection((url.host, url.port or 5432), timeout=1.0):
            return True
    except OSError:
        return False


def explain_errors(url: URL, limits: dict[str, float]):
    """A ``handle_error`` hook: a failed connect, a timeout or a lost connection becomes one
    ``WarehouseUnavailable`` line (where, what, which bound and how to change it)."""
    import psycopg

    where = _where(url)

    def bound(key: str) -> str:
        return f"{key}={limits.get(key, 0):g} s ({TIMEOUT_ENV[key]} or ?{key}= to change it)"

    def explain(ctx) -> BaseException | None:  # noqa: ANN001 - sqlalchemy.engine.ExceptionContext
        orig = ctx.original_exception
        if ctx.is_pre_ping or not isinstance(orig, psycopg.OperationalError):
            return None
        detail = redact(_SERVER_PREFIX.sub("", (str(orig).strip() or type(orig).__name__).splitlines()[0]))
        if isinstance(orig, psycopg.errors.LockNotAvailable):
            msg = f"warehouse {where}: waited past {bound('lock_timeout')} for a lock another session holds"
        elif isinstance(orig, psycopg.errors.QueryCanceled) and "statement timeout" in detail:
            msg = f"warehouse {where}: a statement ran past {bound('statement_timeout')}"
        elif isinstance(orig, NoAnswer):
            msg = (f"warehouse {where}: the server sent no answer within {bound('response_timeout')}: frozen, or"
                   " the network cut; the open transaction was not committed")
        elif ctx.connection is None and _NOT_POSTGRES.search(detail):
            msg = (f"warehouse {where} answered, but not as a PostgreSQL server ({detail}): is that the"
                   " database's port?")
        elif ctx.connection is None:
            late = "timeout" in detail.lower()
            if late and _listens(url):
                msg = (f"warehouse {where} took the connection but gave no PostgreSQL answer within "
                       f"{bound('connect_timeout')}: is that the database's port, or is the server stuck?")
            else:
                within = f" within {bound('connect_timeout')}" if late else ""
                msg = f"warehouse {where} is not reachable: {detail}{within}"
        elif ctx.is_disconnect:
            msg = f"warehouse {where} closed the connection: {detail}"
        else:
            return None
        return WarehouseUnavailable(msg, orig)

    return explain


def _json_dumps(value: object) -> str:
    """JSONB values: numpy numbers allowed, NaN/inf become null (Postgres JSON has neither)."""
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS).decode()

