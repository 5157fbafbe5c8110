"""``servetune history`` compares like with like, and says why a campaign failed (real Postgres).

Campaigns are built by ``report_fixtures.write_campaign`` and loaded with the warehouse's loader; the
plan stored in experiment.json is then what tells two runs apart (servetune.warehouse.previous).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from sqlalchemy import select, text
from typer.testing import CliRunner

from report_fixtures import make_trial, write_campaign
from servetune.cli import app
from servetune.ingest import load_result
from servetune.report.history import HistoryEntry, fetch_history, history_table
from servetune.warehouse import db, migrate
from servetune.warehouse.previous import describe
from servetune.warehouse.tables import experiments
from test_warehouse_schema import table_columns

MODEL = "llama-3.1-8b"
START = datetime(2026, 10, 5, 3, 0, tzinfo=UTC)
SECRET = "sk-live-abcdef1234567890"
runner = CliRunner()


def _campaign(root: Path, week: int, *, speed: float = 1.0, name: str = "llama-chat",
              sla: dict[str, float] | None = None, **exp: Any) -> Path:
    """A fixture campaign whose stored plan has a name (and ``sla`` over the fixture's p99 bounds)."""
    d = write_campaign(root, model=MODEL, started=START + timedelta(weeks=week), speed=speed)
    data = orjson.loads((d / "experiment.json").read_bytes())
    data["plan"]["name"] = name
    data["plan"]["sla"].update(sla or {})
    data.update(exp)
    (d / "experiment.json").write_bytes(orjson.dumps(data))
    return d


def _failed_campaign(root: Path, week: int, *, status: str = "failed", status_reason: str | None = None,
                     trial_reason: str = "HTTP 500 from the engine") -> Path:
    """Three correctness trials that all failed; experiment.json says ``status`` (and why, when given)."""
    eid = uuid.uuid4().hex
    d = root / eid
    t = START + timedelta(weeks=week)
    for i in range(3):
        trial = make_trial(experiment_id=eid, stage="correctness", concurrency=1, created=t + timedelta(minutes=i))
        trial.status, trial.failure_reason = "failed", f"{trial_reason} (attempt {i + 1})"
        trial.save(d / "trials" / f"{trial.trial_id}.json")
    record = {"experiment_id": eid, "model": MODEL, "engine": "sglang", "trigger": "weekly", "status": status,
              "plan": {"name": "llama-chat", "model": MODEL, "sla": {"p99_ttft_ms": 800.0}},
              "started_at": t.isoformat(), "status_reason": status_reason}
    (d / "experiment.json").write_bytes(orjson.dumps(record))
    return d


def _load(url: str, d: Path) -> str:
    report = load_result(url, d, validate=False)
    assert report.ok, report.errors
    return report.experiment_id


def _rows(entries: list[HistoryEntry]) -> dict[str, str]:
    """Each experiment's table line (by id), as the terminal shows it."""
    console = Console(width=260, record=True)
    console.print(history_table(MODEL, entries))
    lines = console.export_text().splitlines()
    return {e.experiment_id: next(ln for ln in lines if e.experiment_id[:12] in ln) for e in entries}


def _arrows(line: str) -> int:
    return sum(line.count(a) for a in "↑↓→")


def test_an_sla_change_draws_no_arrow_and_says_what_changed(fresh_database_url: str, tmp_path: Path) -> None:
    url = fresh_database_url
    migrate.upgrade(url)
    first = _load(url, _campaign(tmp_path, 0, speed=1.0))
    same = _load(url, _campaign(tmp_path, 1, speed=1.2))  # same plan and SLA: arrows
    tighter = _load(url, _campaign(tmp_path, 2, speed=0.8, sla={"p99_ttft_ms": 600.0}))  # SLA changed: none
    back = _load(url, _campaign(tmp_path, 3, speed=1.1))  # the first SLA again: compared with `same`

    entries = fetch_history(MODEL, database_url=url)
    by_id = {e.experiment_id: e for e in entries}
    assert [e.experiment_id for e in entries] == [back, tighter, same, first]
    assert by_id[same].compared_with == first and by_id[same].note is None
    assert by_id[tighter].compared_with is None
    assert by_id[tighter].note == "SLA changed: p99 TTFT 800 -> 600 ms"
    assert by_id[back].compared_with == same and by_id[back].note.startswith(f"vs {same[:12]}")
    assert by_id[back].previous["goodput_rps"] == by_id[same].goodput_rps

    rows = _rows(entries)
    assert _arrows(rows[same]) == 5 and "↑" in rows[same]  # ceiling, goodput, tok/s, p99 TTFT, hit rate
    assert _arrows(rows[tighter]) == 0 and "SLA changed: p99 TTFT 800 -> 600 ms" in rows[tighter]
    assert _arrows(rows[back]) == 5 and f"vs {same[:12]}" in rows[back]
    assert _arrows(rows[first]) == 0  # nothing older


def test_another_plan_or_workload_is_not_compared(fresh_database_url: str, tmp_path: Path) -> None:
    url = fresh_database_url
    migrate.upgrade(url)
    _load(url, _campaign(tmp_path, 0))
    renamed = _load(url, _campaign(tmp_path, 1, name="llama-batch"))
    d = _campaign(tmp_path, 2, name="llama-batch")
    data = orjson.loads((d / "experiment.json").read_bytes())
    data["plan"]["workload"] = {"input_tokens": 2048}
    (d / "experiment.json").write_bytes(orjson.dumps(data))
    reworked = _load(url, d)

    by_id = {e.experiment_id: e for e in fetch_history(MODEL, database_url=url)}
    assert by_id[renamed].compared_with is None and by_id[renamed].note == "plan changed: llama-chat -> llama-batch"
    assert by_id[reworked].compared_with is None
    assert by_id[reworked].note == "workload changed: input_tokens unset -> 2048"


def test_describe_names_each_change() -> None:
    old = {"sla": {"p99_ttft_ms": 2000.0, "max_error_rate": 0.01}, "engine": {"kind": "sglang"}}
    new = {"sla": {"p99_ttft_ms": 1500.0, "max_error_rate": 0.01}, "engine": {"kind": "vllm"},
           "load": {"mode": "rate"}}
    assert describe(old, new) == ["SLA changed: p99 TTFT 2000 -> 1500 ms", "load changed: concurrency -> rate",
                                  "engine changed: sglang -> vllm"]
    assert describe(old, old) == []


def _stored(url: str, experiment_id: str) -> tuple[str | None, str]:
    eng = db.engine(url)
    try:
        with eng.connect() as conn:
            return conn.execute(select(experiments.c.failure_reason, text("xmin::text"))
                                .where(experiments.c.experiment_id == experiment_id)).one()
    finally:
        eng.dispose()


def test_failure_reason_is_stored_once_redacted_and_shown(fresh_database_url: str, tmp_path: Path) -> None:
    url = fresh_database_url
    migrate.upgrade(url)
    ok = _load(url, _campaign(tmp_path, 0))
    why = f"correctness trial failed: HTTP 500 (api_key={SECRET})\nTraceback: second line"
    d = _failed_campaign(tmp_path, 1, status_reason=why)
    failed = _load(url, d)
    reason, xmin = _stored(url, failed)
    assert reason == "correctness trial failed: HTTP 500 (api_key=***)"  # one line, the key masked
    assert _load(url, d) == failed and _stored(url, failed) == (reason, xmin)  # reloaded: the row not rewritten

    entries = fetch_history(MODEL, database_url=url)
    by_id = {e.experiment_id: e for e in entries}
    assert by_id[failed].failure_reason == reason and by_id[ok].failure_reason is None
    line = _rows(entries)[failed]
    assert "0/3" in line and "correctness trial failed: HTTP 500 (api_key=***)" in line and SECRET not in line

    result = runner.invoke(app, ["history", "--model", MODEL, "--database-url", url], env={"COLUMNS": "260"})
    assert result.exit_code == 0, result.output
    assert "correctness trial failed: HTTP 500" in result.output and SECRET not in result.output

    # resumed, the campaign concluded: the reload clears the reason
    data = orjson.loads((d / "experiment.json").read_bytes())
    data.update(status="done", status_reason="the ramp found the ceiling")
    (d / "experiment.json").write_bytes(orjson.dumps(data))
    _load(url, d)
    assert _stored(url, failed)[0] is None


def test_trials_say_why_when_the_experiment_does_not(fresh_database_url: str, tmp_path: Path) -> None:
    """No status_reason (an older campaign, a done status with every trial failed): the first trial's reason."""
    url = fresh_database_url
    migrate.upgrade(url)
    old = _load(url, _failed_campaign(tmp_path, 0, status="failed", trial_reason=f"engine died token={SECRET}"))
    done = _load(url, _failed_campaign(tmp_path, 1, status="done", trial_reason="connection refused"))
    assert _stored(url, old)[0] is None and _stored(url, done)[0] is None

    by_id = {e.experiment_id: e for e in fetch_history(MODEL, database_url=url)}
    assert by_id[old].failure_reason == "engine died token=*** (attempt 1)"
    assert by_id[done].failure_reason == "connection refused (attempt 1)"
    rows = _rows(list(by_id.values()))
    assert "connection refused (attempt 1)" in rows[done] and "0/3" in rows[done]


def test_a_failed_bench_result_keeps_its_reason(fresh_database_url: str, tmp_path: Path) -> None:
    url = fresh_database_url
    migrate.upgrade(url)
    trial = make_trial(experiment_id="x", stage="ramp", concurrency=8, created=START)
    trial.experiment_id, trial.status, trial.failure_reason = None, "failed", "server not ready after 600 s"
    report = load_result(url, trial, validate=False)
    assert report.ok, report.errors
    assert _stored(url, report.experiment_id)[0] == "server not ready after 600 s"


def test_bench_results_compare_at_the_same_load_only(fresh_database_url: str, tmp_path: Path) -> None:
    """A bench result has no plan: its trial's SLA, workload and load (mode and level) are its conditions."""
    url = fresh_database_url
    migrate.upgrade(url)
    ids = []
    for hour, (c, speed) in enumerate(((8, 1.0), (8, 1.2), (16, 1.2))):
        trial = make_trial(experiment_id="x", stage="ramp", concurrency=c, created=START + timedelta(hours=hour),
                           speed=speed)
        trial.experiment_id = None
        report = load_result(url, trial, validate=False)
        assert report.ok, report.errors
        ids.append(report.experiment_id)
    campaign = _load(url, _campaign(tmp_path, 1))
    c8, again, c16 = ids

    by_id = {e.experiment_id: e for e in fetch_history(MODEL, database_url=url)}
    assert by_id[again].compared_with == c8 and by_id[again].goodput_rps > by_id[c8].goodput_rps
    assert by_id[c16].compared_with is None and by_id[c16].note == "load changed: concurrency 8 -> concurrency 16"
    assert by_id[campaign].compared_with is None and by_id[campaign].note == "the previous run is a bench result"
    rows = _rows(list(by_id.values()))
    assert _arrows(rows[again]) >= 3 and _arrows(rows[c16]) == 0


def test_migration_0014_up_and_down(fresh_database_url: str, tmp_path: Path) -> None:
    url = fresh_database_url
    migrate.upgrade(url)
    assert migrate.current(url) == migrate.head() and migrate.head() >= "0014"
    assert "failure_reason" in table_columns(url, "experiments")
    failed = _load(url, _failed_campaign(tmp_path, 0, status_reason="campaign aborted: OSError: disk full"))

    migrate.downgrade(url, "0013")
    assert migrate.current(url) == "0013" and "failure_reason" not in table_columns(url, "experiments")
    eng = db.engine(url)
    try:
        with eng.connect() as conn:  # the experiment itself stays
            assert conn.execute(text("select count(*) from experiments where experiment_id = :e"),
                                {"e": failed}).scalar() == 1
    finally:
        eng.dispose()

    migrate.upgrade(url)
    assert "failure_reason" in table_columns(url, "experiments")
    assert _stored(url, failed)[0] is None  # dropped with the column; a reload puts it back
