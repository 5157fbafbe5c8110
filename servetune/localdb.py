"""Find or start a PostgreSQL server when no database URL is configured.

Used by the test harness and by the main job, so both run on a fresh machine:
1. an explicit URL (``SERVETUNE_TEST_DATABASE_URL`` for tests, ``SERVETUNE_DATABASE_URL`` otherwise);
2. a server already answering on 127.0.0.1:5432 (trust auth);
3. a private cluster started with Debian's initdb/pg_ctl (as the ``postgres`` user when we are root);
4. the pip-installable embedded server ``pgserver``.
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

log = logging.getLogger(__name__)

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


class NoPostgresError(RuntimeError):
    pass


def redact(url: str) -> str:
    """The URL with its password hidden, for logs and messages (servetune.redact: string-level, so a
    password holding a raw ``@`` is hidden whole, even where SQLAlchemy would misparse it)."""
    from servetune.redact import redact_text

    return redact_text(url)


def libpq_dsn(url: str) -> str:
    """SQLAlchemy URL -> libpq connection string for psycopg."""
    u = make_url(url)
    return u.set(drivername="postgresql").render_as_string(hide_password=False)


def answers(url: str, timeout: float = 2.0) -> bool:
    try:
        with psycopg.connect(libpq_dsn(url), connect_timeout=max(1, int(timeout))):
            return True
    except psycopg.Error:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pg_bindir() -> Path | None:
    for cand in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (cand / "initdb").exists() and (cand / "pg_ctl").exists():
            return cand
    found = shutil.which("initdb")
    return Path(found).parent if found and shutil.which("pg_ctl") else None


@dataclass
class PrivateCluster:
    """A throw-away PostgreSQL cluster on a free loopback port."""

    datadir: Path
    port: int
    bindir: Path | None  # None: pgserver
    _pgserver: object | None = field(default=None, repr=False)
    _user: str | None = None

    @property
    def url(self) -> str:
        user = self._user or "postgres"
        if self._pgserver is not None:
            return self._pgserver_url
        return f"postgresql+psycopg://{user}@127.0.0.1:{self.port}/postgres"

    def _run(self, argv: list[str]) -> None:
        run_as = None
        if os.geteuid() == 0:  # initdb refuses to run as root
            pw = pwd.getpwnam("postgres")
            run_as = (pw.pw_uid, pw.pw_gid)

        def demote() -> None:
            if run_as:
                os.setgid(run_as[1])
                os.setuid(run_as[0])

        subprocess.run(argv, check=True, capture_output=True, preexec_fn=demote if run_as else None)

    def start(self) -> PrivateCluster:
        if self.bindir is None:
            import pgserver  # type: ignore[import-not-found]

            srv = pgserver.get_server(str(self.datadir), cleanup_mode="stop")
            self._pgserver = srv
            self._pgserver_url = "postgresql+psycopg://" + srv.get_uri().split("://", 1)[1]
            return self
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.datadir, pw.pw_uid, pw.pw_gid)
        self._run([str(self.bindir / "initdb"), "-D", str(self.datadir), "-U", "postgres", "-A", "trust",
                   "--no-sync", "-E", "UTF8"])
        self.serve()
        return self

    def pg_ctl(self, *args: str) -> None:
        self._run([str(self.bindir / "pg_ctl"), "-D", str(self.datadir), *args])

    def serve(self) -> None:
        """Start the server on its data directory and port (again, after ``halt``)."""
        opts = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.datadir} -c fsync=off"
        self.pg_ctl("-o", opts, "-w", "-t", "60", "-l", str(self.datadir / "server.log"), "start")

    def halt(self) -> None:
        """Stop the server and keep its data: the warehouse-outage tests and benches start it again."""
        self.pg_ctl("-m", "fast", "-w", "stop")

    def stop(self) -> None:
        if self._pgserver is not None:
            self._pgserver.cleanup()  # type: ignore[attr-defined]
        elif self.bindir is not None:
            try:
                self.halt()
            except subprocess.CalledProcessError as e:  # already gone
                log.warning("pg_ctl stop: %s", e.stderr)
        shutil.rmtree(self.datadir, ignore_errors=True)


def start_private_cluster(base_dir: str | Path | None = None) -> PrivateCluster:
    """Start a private cluster with the system's PostgreSQL binaries, else with pgserver."""
    bindir = _pg_bindir()
    datadir = Path(tempfile.mkdtemp(prefix="servetune-pg-", dir=base_dir))
    os.chmod(datadir, 0o755)
    if bindir is None:
        try:
            import pgserver  # type: ignore[import-not-found]  # noqa: F401
        except ImportError as e:
            raise NoPostgresError(
                "no PostgreSQL server is reachable and none can be started: install Debian's "
                "`postgresql` package (apt-get install postgresql) or `pip install pgserver`, "
                "or set SERVETUNE_DATABASE_URL"
            ) from e
    return PrivateCluster(datadir=datadir, port=_free_port(), bindir=bindir).start()


def resolve_server(explicit_env: str = "SERVETUNE_DATABASE_URL") -> tuple[str, PrivateCluster | None]:
    """A server URL to use: the configured one, the local default, or a private cluster we started.

    The caller owns the returned cluster (stop it when done).
    """
    url = os.environ.get(explicit_env)
    if url:
        return url, None
    if answers(DEFAULT_URL):
        return DEFAULT_URL, None
    log.info("no PostgreSQL on 127.0.0.1:5432; starting a private cluster")
    cluster = start_private_cluster()
    return cluster.url, cluster


def create_database(server_url: str, name: str | None = None, *, template: str | None = None) -> str:
    """Create a fresh database on the server (a copy of ``template``, a database nobody is connected to, when
    given: a migrated schema copied in milliseconds) and return its URL."""
    name = name or f"servetune_{uuid.uuid4().hex[:10]}"
    stmt = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        stmt = sql.SQL("{} TEMPLATE {}").format(stmt, sql.Identifier(template))
    with psycopg.connect(libpq_dsn(server_url), autocommit=True) as conn:
        conn.execute(stmt)
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


def drop_database(server_url: str, name: str) -> None:
    with psycopg.connect(libpq_dsn(server_url), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def wait_until_answers(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not answers(url):
        if time.monotonic() > deadline:
            raise NoPostgresError(f"PostgreSQL at {redact(url)} did not answer within {timeout:.0f}s")
        time.sleep(0.2)
