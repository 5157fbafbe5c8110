"""The history views and example queries on a seeded year of weekly campaigns (real Postgres, real psql)."""

from __future__ import annotations

import shutil
import subprocess
from datetime import UTC, datetime, timedelta

import orjson
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from servetune.cli import app
from servetune.validation import validate
from servetune.warehouse import db, queries
from servetune.warehouse.loader import ExperimentInfo, load_trial
from warehouse_fixtures import make_trial, migrated, passing_report

MODEL = "llama-8b"
WEEKS = 52
# 60% -> 57% (noise) and 60% -> 20% (a real regression: a prompt template that broke the shared prefix)
DRIFT_WEEK, DROP_WEEK = 20, 40
SLOW_WEEKS = {5, 6, 30}  # concurrency 32 misses the p99 TTFT bound: the ceiling falls back to 16


def _hit_rate(week: int) -> float:
    if week >= DROP_WEEK:
        return 0.20
    return 0.57 if week == DRIFT_WEEK else 0.60


@pytest.fixture(scope="module")
def year(pg_server_url):
    from servetune import localdb

    url = localdb.create_database(pg_server_url)
    migrated(url)
    eng = db.engine(url)
    report = passing_report()  # a real GX report, attached so 104 trials need not each run GX
    this_monday = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    this_monday -= timedelta(days=this_monday.weekday())
    starts = []
    for week in range(WEEKS):
        started = this_monday - timedelta(weeks=WEEKS - 1 - week) + timedelta(hours=3)
        starts.append(started)
        exp = ExperimentInfo(
            experiment_id=f"w{week:02d}", model=MODEL, engine="sglang", model_fingerprint="m-1",
            prompt_template_fingerprint="tmpl-B" if week >= DROP_WEEK else "tmpl-A", trigger="weekly",
            dag_run_id=f"scheduled__{started:%Y-%m-%d}", status="finished", started_at=started,
            finished_at=started + timedelta(hours=2),
        )
        for c in (16, 32):
            t = make_trial(trial_id=f"w{week:02d}-c{c}", experiment_id=exp.experiment_id, model=MODEL,
                           concurrency=c, n=20, warmup=2, hit_rate=_hit_rate(week), seed=week * 100 + c,
                           t0_unix=started.timestamp() + c,
                           ttft_scale=20.0 if (c == 32 and week in SLOW_WEEKS) else 1.0)
            t.summary.goodput_rps = c * 0.5
            t.validation = report
            load_trial(eng, t, exp)
    # the last campaign also ran concurrency 64, but the checklist rejected it: it must not become the ceiling
    bad = make_trial(trial_id="w51-c64", experiment_id="w51", model=MODEL, concurrency=64, hit_rate=0.95,
                     t0_unix=starts[-1].timestamp() + 64)
    bad.summary.gpu_clean_at_start = False
    bad.summary.goodput_rps = 99.0
    bad.validation = validate(bad).model_dump(mode="json")
    assert bad.validation["success"] is False
    load_trial(eng, bad, ExperimentInfo(experiment_id="w51", model=MODEL, trigger="weekly",
                                        started_at=starts[-1], status="finished",
                                        prompt_template_fingerprint="tmpl-B", engine="sglang",
                                        model_fingerprint="m-1", dag_run_id=f"scheduled__{starts[-1]:%Y-%m-%d}",
                                        finished_at=starts[-1] + timedelta(hours=2)))
    yield url, eng, starts
    eng.dispose()
    localdb.drop_database(pg_server_url, make_url(url).database)


def _all(eng, sql: str, **params):
    with eng.connect() as conn:
        return [r._asdict() for r in conn.execute(text(sql), params)]


def test_accepted_trials_exclude_rejected(year):
    _, eng, _ = year
    rows = _all(eng, "SELECT trial_id, status FROM accepted_trials")
    assert len(rows) == WEEKS * 2
    assert "w51-c64" not in {r["trial_id"] for r in rows}
    assert _all(eng, "SELECT status FROM trials WHERE trial_id = 'w51-c64'") == [{"status": "rejected"}]


def test_cache_hit_regression_flags_the_drop_not_the_drift(year):
    _, eng, starts = year
    flagged = _all(eng, "SELECT * FROM cache_hit_regressions WHERE model = :m", m=MODEL)
    assert len(flagged) == 1
    [row] = flagged
    assert row["week"] == starts[DROP_WEEK].date()
    assert row["prev_hit_rate"] == pytest.approx(0.60, abs=0.005)
    assert row["hit_rate"] == pytest.approx(0.20, abs=0.005)
    assert (row["prev_prompt_template_fingerprints"], row["prompt_template_fingerprints"]) == ("tmpl-A", "tmpl-B")
    drift = _all(eng, "SELECT * FROM cache_hit_rate_weekly WHERE week = :w", w=starts[DRIFT_WEEK].date())[0]
    assert drift["hit_rate_drop"] == pytest.approx(0.03, abs=0.005) and drift["regressed"] is False
    weekly = _all(eng, "SELECT week FROM cache_hit_rate_weekly WHERE model = :m", m=MODEL)
    assert len(weekly) == WEEKS


def test_ceiling_history_and_best_config(year):
    _, eng, starts = year
    ceilings = {r["experiment_id"]: r["ceiling_concurrency"]
                for r in _all(eng, "SELECT experiment_id, ceiling_concurrency FROM ceiling_history")}
    assert len(ceilings) == WEEKS
    assert {w for w in range(WEEKS) if ceilings[f"w{w:02d}"] == 16} == SLOW_WEEKS
    assert ceilings["w51"] == 32  # the rejected 64 does not count
    best = _all(eng, "SELECT week, concurrency, goodput_rps FROM best_config_weekly WHERE model = :m "
                     "ORDER BY week", m=MODEL)
    assert [b["week"] for b in best] == [s.date() for s in starts]
    assert all(b["concurrency"] == (16 if i in SLOW_WEEKS else 32) for i, b in enumerate(best))


def test_named_queries_bind_parameters(year):
    url, eng, starts = year
    cutoff = datetime.now(UTC) - timedelta(days=31)
    cols, rows = queries.run("ceiling_last_month", {"model": MODEL}, engine=eng)
    assert "prefix_hit_rate" in cols and "ceiling_concurrency" in cols
    assert len(rows) == sum(1 for s in starts if s >= cutoff) and len(rows) >= 4
    assert all(float(r[cols.index("prefix_hit_rate")]) == pytest.approx(0.2, abs=0.005) for r in rows)
    # a value that would break out of a quoted string is only ever a bound value
    assert queries.run("ceiling_last_month", {"model": "x' OR '1'='1"}, engine=eng)[1] == []
    cols, rows = queries.run("latency_vs_concurrency", {"model": MODEL}, engine=eng)
    assert [r[cols.index("concurrency")] for r in rows] == [16, 32]
    cols, rows = queries.run("rejected_trials", {}, engine=eng)
    assert [r[cols.index("trial_id")] for r in rows] == ["w51-c64"]
    assert "clean_gpu" in rows[0][cols.index("failed_checks")]
    cols, rows = queries.run("cache_hit_regressions", {"model": MODEL}, engine=eng)
    assert len(rows) == 1 and rows[0][cols.index("prompt_template_changed")] is True
    _, rows = queries.run("cache_hit_regressions", {"min_drop": "0.02", "min_relative": "0.03"}, engine=eng)
    assert len(rows) == 2  # looser thresholds catch the drift too
    _, rows = queries.run("best_config_history", {"model": MODEL, "weeks": "8"}, engine=eng)
    assert 8 <= len(rows) <= 9
    with pytest.raises(queries.QueryError, match="required"):
        queries.run("ceiling_last_month", {}, engine=eng)
    with pytest.raises(queries.QueryError, match="unknown parameter"):
        queries.run("ceiling_last_month", {"model": MODEL, "mdoel": "x"}, engine=eng)


def test_query_cli_formats(year, monkeypatch):
    url, _, _ = year
    monkeypatch.setenv("SERVETUNE_DATABASE_URL", url)
    runner = CliRunner()
    res = runner.invoke(app, ["query", "cache_hit_regressions", "--param", f"model={MODEL}", "--format", "json"])
    assert res.exit_code == 0, res.output
    [row] = orjson.loads(res.stdout)
    assert row["hit_rate"] == pytest.approx(0.2, abs=0.005)
    res = runner.invoke(app, ["query", "latency_vs_concurrency", "-p", f"model={MODEL}", "-f", "csv"])
    assert res.exit_code == 0 and res.stdout.splitlines()[0].startswith("experiment_id,stage,concurrency")
    res = runner.invoke(app, ["query", "ceiling_last_month", "-p", f"model={MODEL}"])
    assert res.exit_code == 0 and "ceiling_last_month" in res.stdout
    res = runner.invoke(app, ["query", "nope"])
    assert res.exit_code == 2 and "no query named" in res.output
    # a model the warehouse does not know by that name: no rows, and the names it does know
    res = runner.invoke(app, ["query", "ceiling_last_month", "-p", "model=llama-8b-typo", "-f", "json"])
    assert res.exit_code == 0 and orjson.loads(res.stdout) == []
    assert f"no rows for model 'llama-8b-typo'; the warehouse knows: {MODEL}" in res.stderr


@pytest.mark.skipif(shutil.which("psql") is None, reason="psql not installed")
def test_query_files_run_under_psql(year):
    url, _, _ = year
    u = make_url(url)
    argv = ["psql", "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", u.host or "127.0.0.1", "-p", str(u.port or 5432),
            "-U", u.username or "postgres", "-d", u.database,
            "-v", f"model={MODEL}", "-v", "min_drop=0.10", "-v", "min_relative=0.20",
            "-f", str(queries.QUERIES_DIR / "cache_hit_regressions.sql")]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    assert out.count("\n") == 0 and out.startswith(f"{MODEL}|")
