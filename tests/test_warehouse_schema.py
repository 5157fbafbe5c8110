"""Warehouse schema: Alembic up and down on a real Postgres, migrations match tables.py, URL resolution."""

from __future__ import annotations

import orjson
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect
from typer.testing import CliRunner

from servetune.cli import app
from servetune.warehouse import db, migrate
from servetune.warehouse.tables import metadata
from servetune.warehouse.views import view_names

TABLES = {"experiments", "acceptances", "trials", "request_records", "gpu_samples", "server_samples", "validations",
          "asset_fingerprints", "scheduler_batches", "diagnoses"}
CORE_TABLES = TABLES - {"asset_fingerprints", "scheduler_batches", "diagnoses", "acceptances"}  # before 0003
SCHED_COLUMNS = {"sched_prefill_batches", "sched_decode_lines", "sched_decode_running_mean",
                 "sched_gen_throughput_mean", "sched_queue_max", "sched_token_usage_max", "sched_cache_hit_rate",
                 "sched_cuda_graph_fraction"}


def _objects(url: str) -> tuple[set[str], set[str]]:
    eng = db.engine(url)
    try:
        insp = inspect(eng)
        return set(insp.get_table_names()) - {"alembic_version"}, set(insp.get_view_names())
    finally:
        eng.dispose()


def table_columns(url: str, table: str = "trials") -> set[str]:
    """The columns a warehouse table has now (a migration test's before and after)."""
    eng = db.engine(url)
    try:
        return {c["name"] for c in inspect(eng).get_columns(table)}
    finally:
        eng.dispose()


def test_migrations_up_down_up(fresh_database_url):
    url = fresh_database_url
    migrate.upgrade(url)
    tables, views = _objects(url)
    assert tables == TABLES
    assert views == set(view_names()) and "cache_hit_regressions" in views
    assert migrate.current(url) == migrate.head()

    migrate.downgrade(url, "0004")  # 0005 added scheduler_batches and the sched_* summary columns
    assert _objects(url)[0] == TABLES - {"scheduler_batches", "diagnoses", "acceptances"}
    assert not SCHED_COLUMNS & table_columns(url)
    migrate.upgrade(url)
    assert SCHED_COLUMNS <= table_columns(url)

    migrate.downgrade(url, "0001")
    assert _objects(url) == (CORE_TABLES, set())
    migrate.downgrade(url, "base")
    assert _objects(url) == (set(), set())
    assert migrate.current(url) is None

    migrate.upgrade(url)
    assert _objects(url)[0] == TABLES


def test_migration_0015_adds_the_answer_s_cost_to_experiments(fresh_database_url):
    url = fresh_database_url
    cost = {"gpu_seconds", "server_starts", "startup_gpu_seconds"}
    migrate.upgrade(url)
    assert cost <= table_columns(url, "experiments")
    migrate.downgrade(url, "0014")
    assert migrate.current(url) == "0014" and not cost & table_columns(url, "experiments")
    assert "failure_reason" in table_columns(url, "experiments")  # 0014's column stays
    migrate.upgrade(url)
    assert cost <= table_columns(url, "experiments") and migrate.current(url) == migrate.head()


def test_migrations_match_tables_py(fresh_database_url):
    """A TrialSummary field added without a migration shows up here as a difference."""
    migrate.upgrade(fresh_database_url)
    eng = db.engine(fresh_database_url)
    try:
        with eng.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), metadata)
    finally:
        eng.dispose()
    assert diff == []


def test_summary_percentiles_are_real_columns():
    cols = set(metadata.tables["trials"].c.keys())
    for name in ("ttft_p50_ms", "ttft_p99_ms", "itl_p99_ms", "tpot_p99_ms", "e2e_p99_ms", "input_len_p50",
                 "output_len_p99", "output_tokens_per_s", "goodput_rps", "prefix_hit_rate", "gpu_mem_peak_bytes"):
        assert name in cols


def test_url_from_env_and_airflow_connection(monkeypatch):
    monkeypatch.delenv(db.URL_ENV, raising=False)
    monkeypatch.delenv(db.AIRFLOW_CONN_ENV, raising=False)
    with pytest.raises(db.WarehouseConfigError, match="SERVETUNE_DATABASE_URL"):
        db.resolve_url()

    monkeypatch.setenv(db.AIRFLOW_CONN_ENV, "postgres://wh_user:s%40cret@db.example:6543/warehouse?sslmode=require")
    url = db.resolve_url()
    assert url == "postgresql+psycopg://wh_user:s%40cret@db.example:6543/warehouse?sslmode=require"
    assert "s%40cret" not in db.redact(url) and "***" in db.redact(url)

    monkeypatch.setenv(db.AIRFLOW_CONN_ENV, orjson.dumps({
        "conn_type": "postgres", "host": "db.example", "login": "wh", "password": "p@ss:word",
        "port": 5433, "schema": "warehouse", "extra": {"sslmode": "verify-full"}}).decode())
    url = db.resolve_url()
    assert url.startswith("postgresql+psycopg://wh:") and url.endswith("@db.example:5433/warehouse?sslmode=verify-full")
    from sqlalchemy.engine import make_url
    assert make_url(url).password == "p@ss:word"

    monkeypatch.setenv(db.AIRFLOW_CONN_ENV, '{"conn_type": "mysql", "host": "x"}')
    with pytest.raises(db.WarehouseConfigError, match="not postgres"):
        db.resolve_url()

    monkeypatch.setenv(db.URL_ENV, "postgresql://a@h/d")  # the explicit variable wins
    assert db.resolve_url() == "postgresql+psycopg://a@h/d"


def test_cli_never_prints_the_password(monkeypatch, caplog):
    secret = "Zq9-very-secret"
    monkeypatch.delenv(db.URL_ENV, raising=False)
    # nothing listens on port 1: the connection fails and the error is reported
    monkeypatch.setenv(db.AIRFLOW_CONN_ENV, f"postgres://u:{secret}@127.0.0.1:1/wh")
    res = CliRunner().invoke(app, ["db", "upgrade"])
    assert res.exit_code == 2
    assert "not reachable" in res.output
    assert secret not in res.output and secret not in caplog.text


def test_cli_upgrade_and_current(fresh_database_url, monkeypatch):
    monkeypatch.setenv(db.URL_ENV, fresh_database_url)
    runner = CliRunner()
    res = runner.invoke(app, ["db", "upgrade"])
    assert res.exit_code == 0, res.output
    assert f"at revision {migrate.head()}" in res.output
    res = runner.invoke(app, ["db", "downgrade", "base"])
    assert res.exit_code == 2 and "--yes" in res.output
    res = runner.invoke(app, ["db", "downgrade", "base", "--yes"])
    assert res.exit_code == 0 and "at revision base" in res.output


def test_views_show_the_validity_and_scheduler_columns(fresh_database_url):
    """accepted_trials selects t.*, expanded when it is created: migrations that add columns recreate it."""
    migrate.upgrade(fresh_database_url)
    eng = db.engine(fresh_database_url)
    try:
        cols = {c["name"] for c in inspect(eng).get_columns("accepted_trials")}
    finally:
        eng.dispose()
    assert {"valid", "completions_in_window", "in_flight_mean", "sched_cache_hit_rate"} <= cols
    migrate.downgrade(fresh_database_url, "0003")
    migrate.upgrade(fresh_database_url)


def test_load_refuses_a_warehouse_behind_ahead_foreign_or_unmigrated_and_writes_nothing(fresh_database_url, tmp_path):
    """`load` checks the schema before any write: each case is one line naming the way it is off, exit 2, and
    no row lands; at the head revision the same trial loads."""
    from sqlalchemy import text

    from warehouse_fixtures import make_trial

    trial = tmp_path / "t.json"
    make_trial().save(trial)
    url = fresh_database_url
    eng = db.engine(url)

    def load() -> tuple[int, str]:
        r = CliRunner().invoke(app, ["load", str(trial), "--database-url", url, "--no-validate"])
        return r.exit_code, r.output

    def rows() -> int:
        with eng.connect() as conn:
            if "trials" not in inspect(conn).get_table_names():
                return 0
            return conn.execute(text("select count(*) from trials")).scalar_one()

    try:
        code, out = load()
        assert code == 2 and "never migrated: run `servetune db upgrade`" in out, out
        migrate.upgrade(url, "0014")
        code, out = load()
        assert code == 2 and f"at revision 0014, behind this servetune's {migrate.head()}" in out, out
        assert rows() == 0
        migrate.upgrade(url)
        with eng.begin() as conn:
            conn.execute(text("update alembic_version set version_num = '0099_from_the_future'"))
        code, out = load()
        assert code == 2 and "at revision 0099_from_the_future, newer than this servetune's" in out, out
        assert rows() == 0 and len(out.strip().splitlines()) == 1
        with eng.begin() as conn:
            conn.execute(text(f"update alembic_version set version_num = '{migrate.head()}'"))
        code, out = load()
        assert code == 0 and rows() == 1, out
        with eng.begin() as conn:
            conn.execute(text("drop table alembic_version"))
        code, out = load()
        assert code == 2 and "no servetune revision: not a servetune warehouse" in out, out
    finally:
        eng.dispose()
