"""A psycopg connection whose every wait for the server is bounded.

Why: Postgres enforces ``statement_timeout`` itself, so a server that is frozen (its process stopped, its
host hung) while the kernel still takes our bytes never answers and never times out: a load waited as long
as the freeze lasted. Here each round trip (statements, COPY, COMMIT) gives up after ``response_timeout``,
the connection is closed unused, and the transaction it held is never committed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import errors


class NoAnswer(psycopg.OperationalError):
    """The server took a request and sent nothing back within the bound; the connection is closed."""


class BoundedConnection(psycopg.Connection):
    """``psycopg.Connection`` with a default timeout on ``wait`` (psycopg's own argument, None there)."""

    response_timeout: float | None = None

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        bound = timeout if timeout is not None else self.response_timeout
        try:
            return super().wait(gen, interval, bound)
        except errors._WaitTimeout:  # noqa: SLF001 - psycopg's documented signal for ``timeout`` (3.3)
            if timeout is not None:  # psycopg's own bounded waits (cancellation) keep their meaning
                raise
            self.pgconn.finish()  # in an unknown state mid-protocol: never reused, never committed
            raise NoAnswer(f"no answer within {bound:g} s") from None


def bounded_connect(response_timeout: float) -> Callable[..., BoundedConnection]:
    """A SQLAlchemy ``do_connect`` hook: the dialect's own arguments, a bounded connection."""

    def connect(dialect: Any, conn_rec: Any, cargs: tuple, cparams: dict) -> BoundedConnection:  # noqa: ARG001
        conn = BoundedConnection.connect(*cargs, **cparams)
        conn.response_timeout = response_timeout
        return conn

    return connect
