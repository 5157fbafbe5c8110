"""Diagnoses in the warehouse (table, rows written in the load's transaction, named queries), in
``servetune diagnose`` and in the HTML report; real Postgres, real CLI, real report."""

from __future__ import annotations

import tarfile
from pathlib import Path

import orjson
import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from servetune.cli import app
from servetune.ingest import load_result
from servetune.warehouse import db, queries
from warehouse_fixtures import make_trial, migrated, passing_report

REPO = Path(__file__).resolve().parent.parent
H200 = REPO / "tests" / "data" / "gpu-h200-sglang"


def _rows(url: str, trial_id: str) -> list[tuple]:
    eng = db.engine(url)
    try:
        with eng.connect() as conn:
            return list(conn.execute(text("SELECT seq, kind, severity, evidence FROM diagnoses WHERE trial_id = :t"
                                          " ORDER BY seq"), {"t": trial_id}))
    finally:
        eng.dispose()


def test_a_load_writes_the_findings_once_and_a_replace_swaps_them(database_url) -> None:
    url = migrated(database_url)
    trial = make_trial(trial_id="diag-load-1", experiment_id="exp-diag-1", seed=11)
    report = load_result(url, trial, validate=False)
    rows = _rows(url, trial.trial_id)
    assert report.ok and report.trials[0].rows["diagnoses"] == len(rows) > 0
    assert {k.split(".")[0] for _, k, _, _ in rows} >= {"memory", "interference", "prefix_cache"}
    assert all(isinstance(ev, dict) for *_, ev in rows)
    # the same content again: unchanged, nothing doubled
    assert load_result(url, trial, validate=False).trials[0].action == "unchanged"
    assert len(_rows(url, trial.trial_id)) == len(rows)
    # replaced with a cache that no longer serves the shared prefix: the findings follow
    for r in trial.records:
        r.cached_tokens = 2
    trial.workload["spec"]["shared_prefix"] = {"tokens": 600, "share_ratio": 1.0}
    trial.summary.prefix_hit_rate = 0.002
    assert load_result(url, trial, validate=False, replace=True).trials[0].action == "replaced"
    after = _rows(url, trial.trial_id)
    assert "prefix_cache.not_effective" in [k for _, k, _, _ in after]
    assert [s for s, *_ in after] == list(range(len(after)))  # one set, numbered afresh


def test_the_named_query_lists_findings_by_experiment_and_severity(database_url) -> None:
    url = migrated(database_url)
    trial = make_trial(trial_id="diag-q-1", experiment_id="exp-diag-q", seed=12)
    for r in trial.records:
        r.cached_tokens = 1
    trial.workload["spec"]["shared_prefix"] = {"tokens": 500}
    load_result(url, trial, validate=False, replace=True)
    cols, rows = queries.run("diagnoses", {"experiment": "exp-diag-q"}, database_url=url)
    assert {"trial_id", "severity", "kind", "summary", "advice", "evidence"} <= set(cols)
    assert rows and {r[cols.index("trial_id")] for r in rows} == {"diag-q-1"}
    assert rows[0][cols.index("severity")] == "warning"  # most severe first
    cols, warn = queries.run("diagnoses", {"experiment": "exp-diag-q", "min_severity": "warning"}, database_url=url)
    assert [r[cols.index("kind")] for r in warn] == ["prefix_cache.not_effective"]
    # through the CLI as an operator runs it
    out = CliRunner().invoke(app, ["query", "diagnoses", "-p", "experiment=exp-diag-q", "-p", "min_severity=warning",
                                   "--database-url", url], env={"COLUMNS": "2000"})
    assert out.exit_code == 0, out.output
    assert "diagnoses (1 rows)" in out.output and "prefix_cache.not_effective" in out.output


def test_the_regression_audit_shows_both_weeks(database_url) -> None:
    """Two weekly runs of one workload, 60% then 20% hit rate: the audit lists both weeks' cache findings."""
    url = migrated(database_url)
    week1, week2 = 1_763_337_600.0, 1_763_337_600.0 + 7 * 86400  # two Mondays (UTC)
    model = "llama-diag-regress"
    checklist = passing_report()  # the regression view reads accepted trials: ones that passed the checklist
    for n, (t0, hit) in enumerate(((week1, 0.6), (week2, 0.2))):
        trial = make_trial(trial_id=f"diag-reg-{n}", experiment_id=f"exp-diag-reg-{n}", model=model, hit_rate=hit,
                           t0_unix=t0, seed=20 + n, workload_fingerprint="wl-diag-reg")
        trial.workload["spec"]["shared_prefix"] = {"tokens": 600, "share_ratio": 1.0}
        trial.validation = checklist
        load_result(url, trial, validate=False, replace=True)
    cols, rows = queries.run("cache_regression_audit", {"model": model}, database_url=url)
    got = {(r[cols.index("side")], r[cols.index("kind")]) for r in rows}
    assert ("before", "prefix_cache.effective") in got  # 600 of ~1000 tokens cached: the 600 shared
    assert ("regressed", "prefix_cache.not_effective") in got  # 200 of the 600 shareable
    assert {r[cols.index("trial_id")] for r in rows} == {"diag-reg-0", "diag-reg-1"}


def test_servetune_diagnose_on_a_bench_result_and_a_campaign(tmp_path) -> None:
    runner = CliRunner()
    bench = REPO / "tests" / "data" / "gpu-h200" / "bench-c32.json"
    out = runner.invoke(app, ["diagnose", str(bench)], env={"COLUMNS": "400"})
    assert out.exit_code == 0, out.output
    for kind in ("memory.plateau", "interference.by_input_length", "prefix_cache.unknown", "by input length"):
        assert kind in out.output
    with tarfile.open(H200 / "openloop.tar.xz") as tar:
        tar.extractall(tmp_path, filter="data")
    out = runner.invoke(app, ["diagnose", str(tmp_path / "openloop"), "--json"])
    assert out.exit_code == 0, out.output
    found = orjson.loads(out.stdout)
    assert len({f["trial_id"] for f in found}) == 3
    assert {f["kind"] for f in found} >= {"memory.plateau", "prefix_cache.effective", "interference.by_input_length"}
    bad = runner.invoke(app, ["diagnose", str(tmp_path / "missing")])
    assert bad.exit_code == 2 and "no such file" in bad.output


def test_the_report_has_a_diagnoses_section(tmp_path) -> None:
    from servetune.report.html import write_report
    from servetune.report.sources import load_campaign

    trial = make_trial(trial_id="diag-report-1", seed=13)
    for r in trial.records:
        r.cached_tokens = 1
    trial.workload["spec"]["shared_prefix"] = {"tokens": 500}
    path = trial.save(tmp_path / "t.json")
    html = write_report(load_campaign(str(path)), tmp_path / "rep").html_path.read_text()
    section = html[html.index('<section id="diagnoses">'):]
    section = section[: section.index("</section>")]
    assert 'data-kind="prefix_cache.not_effective"' in section and "nonce" in section
    assert 'data-kind="memory.' in section


@pytest.mark.parametrize("name", ["diagnoses", "cache_regression_audit"])
def test_the_named_queries_parse(name: str) -> None:
    q = queries.get(name)
    assert q.description and all(p.default is not None for p in q.params)
