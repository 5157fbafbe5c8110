"""Loading results into a real Postgres: idempotent, atomic per trial, rejected trials kept apart."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from servetune.cli import app
from servetune.ingest import load_result
from servetune.warehouse.loader import LoadError, TrialConflict
from warehouse_fixtures import make_trial, write_campaign

CHILD_TABLES = ("request_records", "gpu_samples", "server_samples", "scheduler_batches", "validations")


def _rows(eng, trial_id: str) -> dict[str, list]:
    out = {}
    with eng.connect() as conn:
        out["trials"] = [tuple(r) for r in conn.execute(text("SELECT * FROM trials WHERE trial_id = :t"),
                                                       {"t": trial_id})]
        for table in CHILD_TABLES:
            out[table] = [tuple(r) for r in conn.execute(
                text(f"SELECT * FROM {table} WHERE trial_id = :t ORDER BY 2"), {"t": trial_id})]
        out["experiments"] = [tuple(r) for r in conn.execute(text(
            "SELECT e.* FROM experiments e WHERE experiment_id IN "
            "(SELECT experiment_id FROM trials WHERE trial_id = :t)"), {"t": trial_id})]
    return out


def test_bench_result_loads_as_one_trial_experiment(wh, tmp_path):
    trial = make_trial(trial_id="lone-1")
    path = trial.save(tmp_path / "bench.json")
    report = load_result(wh, path)
    assert report.ok and report.experiment_id == "bench-lone-1"
    [t] = report.trials
    assert (t.action, t.status) == ("inserted", "ok")
    assert t.rows["request_records"] == len(trial.records) and t.rows["gpu_samples"] == len(trial.gpu["samples"])
    with wh.connect() as conn:
        row = conn.execute(text(
            "SELECT e.trigger, e.model, t.ttft_p99_ms, t.prefix_hit_rate, t.concurrency, t.validation_success "
            "FROM trials t JOIN experiments e USING (experiment_id) WHERE trial_id = 'lone-1'")).one()
        rec = conn.execute(text("SELECT ttft_ms, e2e_ms, tpot_ms, chunk_offsets_ms, chunk_tokens "
                                "FROM request_records WHERE trial_id = 'lone-1' AND request_id = 7")).one()
        accepted = conn.execute(text("SELECT count(*) FROM accepted_trials WHERE trial_id = 'lone-1'")).scalar()
    assert row == ("bench", "llama-8b", trial.summary.ttft_ms.p99, trial.summary.prefix_hit_rate, 16, True)
    r7 = trial.records[7]
    assert rec == (r7.ttft_ms, r7.e2e_ms, pytest.approx(r7.tpot_ms()), r7.chunk_offsets_ms, r7.chunk_tokens)
    assert accepted == 1


def test_same_trial_twice_gives_same_rows(wh):
    trial = make_trial(trial_id="twice-1", seed=3)
    first = load_result(wh, trial)
    before = _rows(wh, "twice-1")
    second = load_result(wh, trial)
    assert first.trials[0].action == "inserted" and second.trials[0].action == "unchanged"
    assert _rows(wh, "twice-1") == before
    assert len(before["request_records"]) == len(trial.records) and before["validations"]


def test_different_content_conflicts_unless_replace(wh):
    trial = make_trial(trial_id="conflict-1")
    load_result(wh, trial, validate=False)
    trial.records[0].ttft_ms += 1.0
    with pytest.raises(TrialConflict, match="conflict-1.*--replace"):
        load_result(wh, trial, validate=False)
    report = load_result(wh, trial, validate=False, replace=True)
    assert report.trials[0].action == "replaced"
    with wh.connect() as conn:
        got = conn.execute(text("SELECT ttft_ms FROM request_records WHERE trial_id='conflict-1' "
                                "AND request_id=0")).scalar()
        n = conn.execute(text("SELECT count(*) FROM request_records WHERE trial_id='conflict-1'")).scalar()
    assert got == trial.records[0].ttft_ms and n == len(trial.records)


def test_load_failing_half_way_leaves_nothing(wh):
    trial = make_trial(trial_id="halfway-1", n=2000)
    trial.records[1500].request_id = trial.records[10].request_id  # primary key clash deep inside the COPY
    with pytest.raises(Exception, match="duplicate key|unique"):
        load_result(wh, trial, validate=False)
    rows = _rows(wh, "halfway-1")
    assert all(v == [] for v in rows.values()), {k: len(v) for k, v in rows.items()}
    with wh.connect() as conn:
        assert conn.execute(
            text("SELECT count(*) FROM experiments WHERE experiment_id='bench-halfway-1'")).scalar() == 0
    # a malformed chunk array fails before anything is written, with the request named
    bad = make_trial(trial_id="halfway-2")
    bad.records[3].chunk_tokens = [1, "x"]
    with pytest.raises(LoadError, match="request 3"):
        load_result(wh, bad, validate=False)
    assert all(v == [] for v in _rows(wh, "halfway-2").values())


def test_rejected_trial_is_stored_with_its_report(wh):
    trial = make_trial(trial_id="rejected-1")
    trial.summary.prefix_hit_rate = None
    report = load_result(wh, trial)
    t = report.trials[0]
    assert t.status == "rejected" and "prefix_hit_rate" in t.failure_reason
    with wh.connect() as conn:
        status, measured, ok = conn.execute(text(
            "SELECT status, measured_status, validation_success FROM trials WHERE trial_id='rejected-1'")).one()
        failed = conn.execute(text("SELECT checklist, expectation, column_name, observed_value FROM validations "
                                   "WHERE trial_id='rejected-1' AND NOT success")).all()
        accepted = conn.execute(text("SELECT count(*) FROM accepted_trials WHERE trial_id='rejected-1'")).scalar()
    assert (status, measured, ok) == ("rejected", "ok", False)
    assert ("prefix_hit_rate", "expect_column_values_to_not_be_null", "prefix_hit_rate") in [f[:3] for f in failed]
    assert accepted == 0


def test_campaign_directory(wh, tmp_path):
    exp = {"experiment_id": "camp-1", "model": "qwen-7b", "engine": "sglang", "model_fingerprint": "m1",
           "prompt_template_fingerprint": "p1", "trigger": "weekly", "dag_run_id": "scheduled__2026-11-23",
           "plan": {"stages": ["baseline", "ramp"]}, "status": "running", "started_at": "2026-11-23T00:00:00+00:00",
           "finished_at": None, "recommendation": None}
    trials = [make_trial(trial_id=f"camp-1-c{c}", experiment_id="camp-1", model="qwen-7b", concurrency=c, seed=c)
              for c in (8, 16)]
    d = write_campaign(tmp_path / "camp", exp, trials)
    (d / "trials" / "broken.json").write_text("{not json")
    report = load_result(wh, d, validate=False)
    assert [t.trial_id for t in report.trials] == ["camp-1-c16", "camp-1-c8"]
    assert len(report.errors) == 1 and "broken.json" in report.errors[0] and "not valid JSON" in report.errors[0]
    # the campaign finishes: reloading updates the experiment and leaves the trials alone
    exp.update(status="finished", recommendation={"ceiling": 16, "config": {"chunked_prefill_size": 4096}})
    write_campaign(d, exp, [])
    (d / "trials" / "broken.json").unlink()
    again = load_result(wh, d, validate=False)
    assert again.ok and {t.action for t in again.trials} == {"unchanged"}
    with wh.connect() as conn:
        status, rec = conn.execute(text("SELECT status, recommendation FROM experiments "
                                        "WHERE experiment_id='camp-1'")).one()
    assert status == "finished" and rec["ceiling"] == 16
    # a trial filed under another experiment is refused, by name
    stray = make_trial(trial_id="stray-1", experiment_id="other")
    write_campaign(d, exp, [stray])
    report = load_result(wh, d, validate=False)
    assert any("stray-1" in e and "other" in e for e in report.errors)


def _cost_row(eng, experiment_id: str) -> tuple:
    with eng.connect() as conn:
        return tuple(conn.execute(text("SELECT gpu_seconds, server_starts, startup_gpu_seconds, xmin::text"
                                       " FROM experiments WHERE experiment_id = :e"), {"e": experiment_id}).one())


def test_the_answer_s_gpu_time_is_stored_with_the_experiment(wh, tmp_path):
    """experiment.json's gpu_seconds and state.json's server starts (migration 0015): loaded, left alone on an
    identical reload (the row is not rewritten), updated when a resumed campaign spent more."""
    import orjson

    exp = {"experiment_id": "cost-1", "model": "qwen-7b", "engine": "sglang", "trigger": "weekly",
           "status": "paused", "started_at": "2026-12-01T00:00:00+00:00", "gpu_seconds": 612.5}
    trials = [make_trial(trial_id=f"cost-1-c{c}", experiment_id="cost-1", concurrency=c, seed=c) for c in (8, 16)]
    d = write_campaign(tmp_path / "cost", exp, trials)
    state = {"outcomes": [{"trial_id": "cost-1-c8", "restarted": True, "startup_seconds": 90.0, "gpu_seconds": 300.0},
                          {"trial_id": "cost-1-c16", "restarted": False, "startup_seconds": 0.0, "gpu_seconds": 312.5}]}
    (d / "state.json").write_bytes(orjson.dumps(state))
    assert load_result(wh, d, validate=False).ok
    first = _cost_row(wh, "cost-1")
    assert first[:3] == (612.5, 1, 90.0)
    assert load_result(wh, d, validate=False).ok
    assert _cost_row(wh, "cost-1") == first  # same xmin: an identical reload rewrites nothing
    # resumed: one more trial on a restarted server, from a state that kept no start-up seconds (older tuner)
    state["outcomes"] = [{k: v for k, v in o.items() if k != "startup_seconds"} for o in state["outcomes"]]
    state["outcomes"].append({"trial_id": "cost-1-c32", "restarted": True, "gpu_seconds": 400.0})
    (d / "state.json").write_bytes(orjson.dumps(state))
    write_campaign(d, {**exp, "status": "done", "gpu_seconds": 1012.5}, [])
    assert load_result(wh, d, validate=False).ok
    assert _cost_row(wh, "cost-1")[:3] == (1012.5, 2, None)  # two starts; their seconds unknown, not 0
    # a lone bench result states no campaign cost
    load_result(wh, make_trial(trial_id="cost-bench"), validate=False)
    assert _cost_row(wh, "bench-cost-bench")[:3] == (None, None, None)


def test_bad_experiment_json_names_the_field(wh, tmp_path):
    d = write_campaign(tmp_path / "bad", {"experiment_id": "x", "model": "m", "trigger": "hourly"}, [])
    with pytest.raises(LoadError, match="trigger"):
        load_result(wh, d)


def test_cli_load(wh, database_url, tmp_path, monkeypatch):
    monkeypatch.setenv("SERVETUNE_DATABASE_URL", database_url)
    path = make_trial(trial_id="cli-1").save(tmp_path / "t.json")
    runner = CliRunner()
    res = runner.invoke(app, ["load", str(path)])
    assert res.exit_code == 0, res.output
    assert "inserted" in res.output and "cli-1" in res.output
    res = runner.invoke(app, ["load", str(path)])
    assert res.exit_code == 0 and "unchanged" in res.output
    res = runner.invoke(app, ["load", str(tmp_path / "nope.json")])
    assert res.exit_code == 2 and "no such file" in res.output
