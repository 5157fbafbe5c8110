"""Warehouse faults against a private, real PostgreSQL: frozen (its postmaster SIGSTOPped), stopped, a
held lock, a slow statement. ``servetune load`` and ``servetune db upgrade`` end within the bound with
one line naming the host (never the password) and a non-zero exit; once the server is back, a retry
stores each trial exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from servetune import localdb
from servetune.cli import app
from servetune.warehouse import db, migrate
from warehouse_fixtures import make_trial, write_campaign

PASSWORD = "Pw-frozen-s3cret"
CONNECT_S = 2  # psycopg's floor
SLACK_S = 3.0  # over twice the same command's own cost, measured beside it (``reference_s``)


class Cluster:
    """localdb's private cluster, with the stop/start/freeze a fault test needs (as the postgres user)."""

    def __init__(self) -> None:
        self.pg = localdb.start_private_cluster()
        self.server_url = self.pg.url
        self.url = make_url(localdb.create_database(self.server_url)).set(password=PASSWORD) \
            .render_as_string(hide_password=False)

    @property
    def where(self) -> str:
        return f"127.0.0.1:{self.pg.port}"

    def postmaster(self) -> int:
        return int((self.pg.datadir / "postmaster.pid").read_text().split()[0])


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    if localdb._pg_bindir() is None:  # noqa: SLF001
        pytest.skip("needs PostgreSQL's initdb/pg_ctl to start, stop and freeze a private server")
    c = Cluster()
    migrate.upgrade(c.url)
    try:
        yield c
    finally:
        try:
            os.kill(c.postmaster(), signal.SIGCONT)
        except (OSError, ValueError):
            pass
        c.pg.stop()


def cli(url: str, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    environ = {**os.environ, db.URL_ENV: url, "SERVETUNE_DB_CONNECT_TIMEOUT": str(CONNECT_S), **env}
    t = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "servetune", *args], capture_output=True, text=True,
                          env=environ, timeout=120)
    return proc, time.monotonic() - t


def reference_s(url: str) -> float:
    """What the CLI costs on this machine now, under whatever else runs: `db current` against the working
    cluster (start, imports, one connection and a query). A bound below is a ratio of it, not seconds."""
    proc, took = cli(url, "db", "current")
    assert proc.returncode == 0, proc.stderr
    return took


def retry(url: str, *args: str) -> str:
    """A retry once the server is back, in this process (the faults above needed real ones)."""
    res = CliRunner().invoke(app, list(args), env={db.URL_ENV: url})
    assert res.exit_code == 0, res.output
    return res.output


def one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode != 0, proc.stdout + proc.stderr
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert PASSWORD not in lines[0] and "Traceback" not in lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def campaign(root: Path, exp_id: str, n: int = 3) -> Path:
    exp = {"experiment_id": exp_id, "model": "m", "engine": "sglang", "trigger": "manual",
           "status": "finished"}
    trials = [make_trial(trial_id=f"{exp_id}-c{c}", experiment_id=exp_id, concurrency=c, n=40, warmup=2,
                         seed=c) for c in (4, 8, 16)[:n]]
    return write_campaign(root / exp_id, exp, trials)


def stored(url: str, exp_id: str) -> tuple[int, int, int]:
    """(trials, distinct trials, request rows) of one experiment: duplicates or losses show."""
    with psycopg.connect(localdb.libpq_dsn(url)) as conn:
        trials, distinct = conn.execute("SELECT count(*), count(DISTINCT trial_id) FROM trials "
                                        "WHERE experiment_id = %s", (exp_id,)).fetchone()
        rows = conn.execute("SELECT count(*) FROM request_records r JOIN trials t USING (trial_id) "
                            "WHERE t.experiment_id = %s", (exp_id,)).fetchone()[0]
    return trials, distinct, rows


def load_twice(url: str, directory: Path, exp_id: str) -> None:
    """The retry stores every trial once; loading again changes nothing."""
    for action in ("inserted", "unchanged"):
        assert retry(url, "load", str(directory), "--no-validate").count(action) == 3
        assert stored(url, exp_id) == (3, 3, 3 * 42)


def test_a_frozen_postgres_fails_within_the_connect_timeout_and_a_retry_loads_once(cluster, tmp_path):
    directory = campaign(tmp_path, "frozen-1")
    pid = cluster.postmaster()
    ref = reference_s(cluster.url)
    os.kill(pid, signal.SIGSTOP)  # the kernel still accepts connections; nothing answers them
    try:
        for args in (("load", str(directory), "--no-validate"), ("db", "upgrade")):
            proc, took = cli(cluster.url, *args)
            # the port takes the connection (the kernel does) and nothing answers: said as such, not "unreachable"
            line = one_line_error(proc, cluster.where, "gave no PostgreSQL answer", "connect_timeout=2 s",
                                  "server stuck")
            assert took < CONNECT_S + 2 * ref + SLACK_S, (took, ref, line)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert stored(cluster.url, "frozen-1") == (0, 0, 0)
    load_twice(cluster.url, directory, "frozen-1")


def test_a_stopped_postgres_fails_at_once_and_a_retry_after_restart_loads_once(cluster, tmp_path):
    directory = campaign(tmp_path, "stopped-1")

    def against_a_stopped_server() -> list[float]:
        cluster.pg.halt()
        tooks = []
        try:
            for args in (("load", str(directory), "--no-validate"), ("db", "upgrade")):
                proc, took = cli(cluster.url, *args)
                one_line_error(proc, cluster.where, "not reachable", "refused")
                tooks.append(took)
        finally:
            cluster.pg.serve()
        return tooks

    # "at once": no retry loop, no wait for a timeout; the bound is the CLI's own cost measured before and after
    # (a 2-core box that got busier in between raised both: one reference read 4.5 s, the failing command 15.8)
    ref = reference_s(cluster.url)
    tooks = against_a_stopped_server()
    ref = max(ref, reference_s(cluster.url))
    if max(tooks) >= 2 * ref + SLACK_S:  # a busy box's one slow start (11.8 s against 11.6): each command's best
        tooks = [min(a, b) for a, b in zip(tooks, against_a_stopped_server(), strict=True)]  # of two tries
        ref = max(ref, reference_s(cluster.url))
    assert max(tooks) < 2 * ref + SLACK_S, (tooks, ref)
    load_twice(cluster.url, directory, "stopped-1")


def test_a_held_lock_ends_at_the_lock_timeout_and_the_trial_loads_once_released(cluster, tmp_path):
    trial = make_trial(trial_id="locked-1", n=40, warmup=2)
    path = trial.save(tmp_path / "locked-1.json")
    ref = reference_s(cluster.url)
    holder = psycopg.connect(localdb.libpq_dsn(cluster.url))
    holder.execute("LOCK TABLE experiments IN ACCESS EXCLUSIVE MODE")  # a migration would hold this
    try:
        proc, took = cli(cluster.url, "load", str(path), "--no-validate", SERVETUNE_DB_LOCK_TIMEOUT="1")
        one_line_error(proc, cluster.where, "lock_timeout=1 s", "SERVETUNE_DB_LOCK_TIMEOUT")
        assert took < 1 + 2 * ref + SLACK_S, (took, ref)
    finally:
        holder.rollback()
        holder.close()
    for action in ("inserted", "unchanged"):
        assert action in retry(cluster.url, "load", str(path), "--no-validate")
    assert stored(cluster.url, "bench-locked-1") == (1, 1, 42)


def test_a_postgres_frozen_in_the_middle_of_a_load_ends_at_the_response_timeout(cluster, tmp_path):
    """The load's own backend stops after it took a statement (found waiting for a lock, then the lock let
    go): no server-side bound can fire, so the client's response_timeout ends it, and nothing is kept."""
    directory = campaign(tmp_path, "midload-1")
    ref = reference_s(cluster.url)
    holder = psycopg.connect(localdb.libpq_dsn(cluster.url))
    holder.execute("LOCK TABLE experiments IN ACCESS EXCLUSIVE MODE")
    env = {**os.environ, db.URL_ENV: cluster.url, "SERVETUNE_DB_RESPONSE_TIMEOUT": "4",
           "SERVETUNE_DB_LOCK_TIMEOUT": "60"}
    t = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "servetune", "load", str(directory), "--no-validate"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    frozen, watcher = None, psycopg.connect(localdb.libpq_dsn(cluster.url), autocommit=True)  # fresh snapshots
    try:
        while frozen is None and time.monotonic() - t < 60 and proc.poll() is None:
            frozen = watcher.execute("SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'").fetchone()
            time.sleep(0.02)
        assert frozen is not None, proc.communicate()[0]
        os.kill(frozen[0], signal.SIGSTOP)
        frozen_at = time.monotonic()  # what comes before (start-up, the lock wait) is not this test's bound
        holder.rollback()  # the lock is free: a live backend would go on now
        output, _ = proc.communicate(timeout=60)
        took = time.monotonic() - frozen_at
    finally:
        if frozen is not None:
            os.kill(frozen[0], signal.SIGCONT)
        holder.close()
        watcher.close()
        proc.kill()
    lines = [ln for ln in output.splitlines() if ln.strip()]
    assert proc.returncode != 0 and len(lines) == 1 and "Traceback" not in output, output
    assert cluster.where in lines[0] and "no answer within response_timeout=4 s" in lines[0], lines[0]
    assert "SERVETUNE_DB_RESPONSE_TIMEOUT" in lines[0] and PASSWORD not in lines[0]
    assert took < 4 + ref + SLACK_S, (took, ref)  # the response timeout, then the command's own exit
    assert stored(cluster.url, "midload-1") == (0, 0, 0)
    load_twice(cluster.url, directory, "midload-1")


def test_the_response_bound_follows_the_statement_bound_unless_set(monkeypatch):
    for env in db.TIMEOUT_ENV.values():
        monkeypatch.delenv(env, raising=False)
    url = make_url("postgresql+psycopg://u@h/d")
    assert db.timeouts(url)["response_timeout"] == 330.0  # 300 s on the server, then 30 s of grace
    monkeypatch.setenv("SERVETUNE_DB_STATEMENT_TIMEOUT", "10")
    assert db.timeouts(url)["response_timeout"] == 40.0
    monkeypatch.setenv("SERVETUNE_DB_STATEMENT_TIMEOUT", "0")  # the server waits for ever: so do we
    assert db.timeouts(url)["response_timeout"] == 0.0
    monkeypatch.setenv("SERVETUNE_DB_RESPONSE_TIMEOUT", "2min")
    assert db.timeouts(url)["response_timeout"] == 120.0
    assert db.timeouts(make_url("postgresql+psycopg://u@h/d?response_timeout=7"))["response_timeout"] == 7.0


def test_statement_timeout_is_set_server_side_and_overridden_by_env_then_url(cluster, monkeypatch):
    def shown(url: str) -> tuple[str, str, str]:
        eng = db.engine(url)
        try:
            with eng.connect() as conn:
                return tuple(conn.execute(text(f"SHOW {k}")).scalar() for k in  # noqa: S608 - fixed names
                             ("statement_timeout", "lock_timeout", "application_name"))
        finally:
            eng.dispose()

    for env in db.TIMEOUT_ENV.values():
        monkeypatch.delenv(env, raising=False)
    assert shown(cluster.url) == ("5min", "30s", "")  # the defaults
    monkeypatch.setenv("SERVETUNE_DB_STATEMENT_TIMEOUT", "1.5")
    monkeypatch.setenv("SERVETUNE_DB_LOCK_TIMEOUT", "250ms")
    assert shown(cluster.url) == ("1500ms", "250ms", "")
    url = cluster.url + "?statement_timeout=2min&options=-c%20application_name%3Dmine"
    assert shown(url) == ("2min", "250ms", "mine")  # the URL wins; its own options are kept

    eng = db.engine(cluster.url + "?statement_timeout=300ms")
    try:
        with eng.connect() as conn, pytest.raises(db.WarehouseUnavailable) as err:
            conn.execute(text("SELECT pg_sleep(5)"))
        assert str(err.value).startswith(f"warehouse {cluster.where}/")
        assert "statement_timeout=0.3 s" in str(err.value)
    finally:
        eng.dispose()

    monkeypatch.setenv("SERVETUNE_DB_CONNECT_TIMEOUT", "soon")
    with pytest.raises(db.WarehouseConfigError, match="CONNECT_TIMEOUT: 'soon' is not a duration"):
        db.engine(cluster.url)
