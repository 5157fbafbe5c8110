"""The SGLang scheduler's batch lines in the warehouse: scheduler_batches rows, sched_* columns, the named query.

Real Postgres, loaded with the warehouse's own loader from result files written by ``TrialResult.save``.
"""

from __future__ import annotations

import pytest
from sqlalchemy import text

from servetune.ingest import load_result
from servetune.warehouse import queries
from servetune.warehouse.loader import LoadError
from servetune.warehouse.tables import SUMMARY_SCALARS
from warehouse_fixtures import make_trial, with_scheduler_log, write_campaign

SCHED = [name for name in SUMMARY_SCALARS if name.startswith("sched_")]


def _batches(eng, trial_id: str) -> list[dict]:
    with eng.connect() as conn:
        return [dict(r) for r in conn.execute(text(
            "SELECT * FROM scheduler_batches WHERE trial_id = :t ORDER BY seq"), {"t": trial_id}).mappings()]


def _trial(eng, trial_id: str) -> dict:
    with eng.connect() as conn:
        return dict(conn.execute(text("SELECT * FROM trials WHERE trial_id = :t"), {"t": trial_id}).mappings().one())


def test_scheduler_rows_and_columns_land_once(wh, tmp_path):
    trial = with_scheduler_log(make_trial(trial_id="sched-1", seed=5))
    path = trial.save(tmp_path / "sched-1.json")  # through the file, as the CLI loads it
    report = load_result(wh, path, validate=False)
    assert report.ok and report.trials[0].rows["scheduler_batches"] == 24

    rows = _batches(wh, "sched-1")
    log_rows = trial.server["scheduler_log"]["rows"]
    assert [r["seq"] for r in rows] == list(range(len(log_rows)))
    assert [{k: r[k] for k in log_rows[0]} for r in rows] == log_rows  # every field, None where the line lacks it
    assert rows[1]["kind"] == "decode" and rows[1]["cuda_graph"] is False and rows[1]["throughput"] == 900.0
    stored = _trial(wh, "sched-1")
    assert {name: stored[name] for name in SCHED} == {name: getattr(trial.summary, name) for name in SCHED}
    assert stored["sched_prefill_batches"] == 12 and stored["sched_queue_max"] == 12
    # the rows live in scheduler_batches only; server_info keeps the log's header
    assert stored["server_info"]["scheduler_log"] == {"parser": "sglang-scheduler-log", "source": "sglang-server.log",
                                                      "unparsed_lines": 0, "resolution_s": 1.0, "row_count": 24}

    again = load_result(wh, path, validate=False)
    assert again.trials[0].action == "unchanged"
    assert _batches(wh, "sched-1") == rows

    trial.server["scheduler_log"]["rows"][0]["queue_req"] = 99  # different content: swapped, not appended
    replaced = load_result(wh, trial, validate=False, replace=True)
    assert replaced.trials[0].action == "replaced"
    after = _batches(wh, "sched-1")
    assert len(after) == len(rows) and after[0]["queue_req"] == 99


def test_trial_without_a_scheduler_log_loads_as_before(wh):
    trial = make_trial(trial_id="sched-none")
    report = load_result(wh, trial, validate=False)
    assert report.ok and report.trials[0].rows["scheduler_batches"] == 0
    assert _batches(wh, "sched-none") == []
    stored = _trial(wh, "sched-none")
    assert all(stored[name] is None for name in SCHED) and "scheduler_log" not in stored["server_info"]


def test_malformed_scheduler_row_loads_nothing(wh):
    trial = with_scheduler_log(make_trial(trial_id="sched-bad"))
    trial.server["scheduler_log"]["rows"][3]["kind"] = "extend"
    with pytest.raises(LoadError, match=r"sched-bad.*scheduler_log\.rows\[3\].*extend"):
        load_result(wh, trial, validate=False)
    with wh.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM trials WHERE trial_id = 'sched-bad'")).scalar() == 0
    assert _batches(wh, "sched-bad") == []


def test_named_query_per_trial_of_an_experiment(wh, tmp_path):
    logged = with_scheduler_log(make_trial(trial_id="sq-32", experiment_id="sq-exp", concurrency=32), concurrency=32)
    plain = make_trial(trial_id="sq-16", experiment_id="sq-exp", concurrency=16)
    other = with_scheduler_log(make_trial(trial_id="sq-other", experiment_id="sq-other-exp"))
    directory = write_campaign(tmp_path / "sq", {"experiment_id": "sq-exp", "model": "llama-8b"}, [logged, plain])
    assert load_result(wh, directory, validate=False).ok
    write_campaign(tmp_path / "sq-other", {"experiment_id": "sq-other-exp", "model": "llama-8b"}, [other])
    assert load_result(wh, tmp_path / "sq-other", validate=False).ok

    query = queries.get("scheduler_batches")
    assert [p.name for p in query.params] == ["experiment"] and "scheduler" in query.description
    cols, rows = queries.run("scheduler_batches", {"experiment": "sq-exp"}, engine=wh)
    got = [dict(zip(cols, r, strict=True)) for r in rows]
    assert [g["trial_id"] for g in got] == ["sq-16", "sq-32"]  # by concurrency; the other campaign left out
    none, s32 = got
    assert (none["log_read"], none["prefill_batches"], none["decode_lines"], none["cache_hit_rate"]) == \
        (False, 0, 0, None)
    s = logged.summary
    assert s32["log_read"] is True
    assert (s32["prefill_batches"], s32["decode_lines"]) == (s.sched_prefill_batches, s.sched_decode_lines)
    assert float(s32["decode_batch_mean"]) == pytest.approx(s.sched_decode_running_mean, abs=0.05)
    assert s32["queue_max"] == s.sched_queue_max
    assert float(s32["token_usage_max"]) == pytest.approx(s.sched_token_usage_max, abs=5e-4)
    assert float(s32["cache_hit_rate"]) == pytest.approx(s.sched_cache_hit_rate, abs=5e-4)
    with pytest.raises(queries.QueryError, match="required"):
        queries.run("scheduler_batches", {}, engine=wh)
