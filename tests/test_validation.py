"""The report checklist as real Great Expectations suites: a clean trial passes; each defect rejects it."""

from __future__ import annotations

import orjson
import pytest
from typer.testing import CliRunner

from servetune.cli import app
from servetune.result import Percentiles
from servetune.validation import EXPECTATIONS_DIR, validate
from warehouse_fixtures import make_trial


def _failed(report) -> set[tuple[str | None, str, str | None]]:
    return {(o.checklist, o.expectation, o.column) for o in report.results if not o.success}


def test_clean_trial_passes():
    report = validate(make_trial())
    assert report.success, _failed(report)
    assert report.gx_version.startswith("1.")
    assert set(report.suites) == {"trial_summary", "trial_requests", "trial_gpu"}
    checklist = {o.checklist for o in report.results}
    assert {"length_distribution", "prefill_decode", "throughput", "gpu_memory_curve", "prefix_hit_rate",
            "sanity_timings", "measured_requests", "error_rate", "clean_gpu"} <= checklist


def test_suites_are_gx_json_files():
    names = sorted(p.stem for p in EXPECTATIONS_DIR.glob("*.json"))
    assert names == ["trial_gpu", "trial_requests", "trial_summary"]
    for p in EXPECTATIONS_DIR.glob("*.json"):
        suite = orjson.loads(p.read_bytes())
        assert suite["name"] == p.stem
        assert all(e["type"].startswith("expect_") for e in suite["expectations"])


def _missing_lengths(t):
    t.summary.input_len = Percentiles()


def _missing_memory_curve(t):
    t.gpu["samples"] = []


def _missing_hit_rate(t):
    t.summary.prefix_hit_rate = None


def _ttft_after_e2e(t):
    r = t.records[50]
    r.ttft_ms = r.e2e_ms + 10.0


def _few_measured(t):
    t.records = t.records[:150]
    t.summary.requests_measured = 140


def _dirty_gpu(t):
    t.gpu["processes_at_start"] = [{"pid": 4242, "name": "python", "used_memory": 2_000_000_000}]
    t.summary.gpu_clean_at_start = False


def _no_steady_window(t):
    t.summary.window_source = "no_steady_window"


def _short_window(t):
    t.summary.window_s = 2.0


def _few_in_window(t):
    t.summary.completions_in_window = 40


def _starved_client(t):
    t.summary.in_flight_min_fraction = 0.6


def _late_open_loop(t):
    t.summary.dispatch_fraction = 0.8


def _tokens_disagree(t):
    t.summary.throughput_mismatch = -0.22


def _goodput_above_throughput(t):
    t.summary.goodput_rps = t.summary.request_throughput * 1.1


@pytest.mark.parametrize("defect, expected", [
    (_no_steady_window, ("steady_window", "expect_column_values_to_be_in_set", "window_source")),
    (_short_window, ("steady_window", "expect_column_values_to_be_between", "window_s")),
    (_few_in_window, ("window_completions", "expect_column_values_to_be_between", "completions_in_window")),
    (_starved_client, ("in_flight_level", "expect_column_values_to_be_between", "in_flight_min_fraction")),
    (_late_open_loop, ("in_flight_level", "expect_column_values_to_be_between", "dispatch_fraction")),
    (_tokens_disagree, ("one_window", "expect_column_values_to_be_between", "throughput_mismatch")),
    (_goodput_above_throughput, ("one_window", "expect_column_pair_values_a_to_be_greater_than_b",
                                 "request_throughput>=goodput_rps")),
], ids=["no-steady-window", "short-window", "few-completions", "starved-client", "late-open-loop",
        "tokens-disagree", "goodput-above-throughput"])
def test_each_validity_defect_rejects(defect, expected):
    trial = make_trial()
    defect(trial)
    report = validate(trial)
    failed = _failed(report)
    assert not report.success and expected in failed
    assert {f[0] for f in failed} == {expected[0]}, failed


def test_a_correctness_check_is_not_judged_as_a_measurement():
    """One request, no steady window: rejected as a measurement, accepted as the check it is, and the
    window items it skipped are named as waived; the rest of the checklist still applies to it."""
    t = make_trial(n=1, warmup=0, concurrency=1)
    as_measurement = {c for c, _, _ in _failed(validate(t))}
    assert {"steady_window", "window_completions"} <= as_measurement, as_measurement
    t.stage = "correctness"
    report = validate(t)
    assert report.success, _failed(report)
    assert {"one_window", "steady_window", "window_completions"} <= set(report.waived)
    assert not {o.checklist for o in report.results} & {"one_window", "steady_window", "window_completions"}
    t.records[0].ttft_ms = t.records[0].e2e_ms + 1  # a broken record still fails it
    assert ("sanity_timings" in {c for c, _, _ in _failed(validate(t))})


def test_validate_uses_the_rules_the_trial_was_measured_under():
    trial = make_trial()
    assert validate(trial).success
    trial.summary.validity_rules = {**trial.summary.validity_rules, "min_window_s": 60.0}
    assert ("steady_window", "expect_column_values_to_be_between", "window_s") in _failed(validate(trial))


@pytest.mark.parametrize("defect, expected", [
    (_missing_lengths, ("length_distribution", "expect_column_values_to_not_be_null", "input_len_p50")),
    (_missing_memory_curve, ("gpu_memory_curve", "expect_table_row_count_to_be_between", None)),
    (_missing_hit_rate, ("prefix_hit_rate", "expect_column_values_to_not_be_null", "prefix_hit_rate")),
    (_ttft_after_e2e, ("sanity_timings", "expect_column_pair_values_a_to_be_greater_than_b", "e2e_ms>=ttft_ms")),
    (_few_measured, ("measured_requests", "expect_table_row_count_to_be_between", None)),
    (_dirty_gpu, ("clean_gpu", "expect_column_values_to_be_in_set", "gpu_clean_at_start")),
], ids=["no-length-distribution", "no-memory-curve", "no-hit-rate", "ttft-gt-e2e", "too-few-measured", "dirty-gpu"])
def test_each_defect_rejects(defect, expected):
    trial = make_trial()
    defect(trial)
    report = validate(trial)
    assert not report.success
    failed = _failed(report)
    assert expected in failed
    # one defect at a time: every failure belongs to the defect's checklist item
    assert {f[0] for f in failed} == {expected[0]}, failed
    # plain words first, the item and its expectation as detail
    from servetune.checklist_report import PLAIN
    reason = report.failure_reason()
    assert reason.startswith("validation failed: ") and f"[{expected[0]}: " in reason, reason
    assert f"{expected[0]}: {expected[1]}" in reason, reason
    assert PLAIN[expected[0]] in reason or expected[0] == "steady_window", reason


def test_observed_values_are_reported():
    trial = make_trial()
    _ttft_after_e2e(trial)
    report = validate(trial)
    bad = next(o for o in report.results if o.column == "e2e_ms>=ttft_ms")
    assert bad.observed_value["unexpected_count"] == 1
    few = make_trial(n=120)
    rows = next(o for o in validate(few).results if o.suite == "trial_requests"
                and o.expectation == "expect_table_row_count_to_be_between")
    assert rows.observed_value == 120 and rows.details["min_value"] == 200  # the bound, resolved


def test_no_gpu_is_rejected_unless_waived():
    trial = make_trial()
    trial.gpu = {"state": "no_gpu", "samples": [], "processes_at_start": None}
    trial.summary.gpu_state = "no_gpu"
    trial.summary.gpu_clean_at_start = None
    trial.summary.gpu_mem_peak_bytes = None
    assert not validate(trial).success
    waived = validate(trial, waive=["gpu_memory_curve", "clean_gpu"])
    assert waived.success and waived.waived == ["clean_gpu", "gpu_memory_curve"]
    assert "trial_gpu" not in waived.suites
    with pytest.raises(ValueError, match="--waive .*: not a checklist item that can be waived"):
        validate(trial, waive=["prefix_hit_rate"])


def test_sampling_hole_rejects():
    trial = make_trial()
    trial.gpu["samples"] = [s for s in trial.gpu["samples"] if not 3.0 < s["t_s"] < 6.0]
    report = validate(trial)
    assert ("gpu_memory_curve", "expect_column_max_to_be_between", "gap_ms") in _failed(report)


def test_cli_validate_and_data_docs(tmp_path):
    good, bad = make_trial(), make_trial()
    _missing_hit_rate(bad)
    good.save(tmp_path / "good.json")
    bad.save(tmp_path / "bad.json")
    runner = CliRunner()
    res = runner.invoke(app, ["validate", str(tmp_path / "good.json"), "--data-docs", str(tmp_path / "docs")])
    assert res.exit_code == 0, res.output
    assert "ACCEPTED" in res.output
    index = tmp_path / "docs" / "index.html"
    assert index.is_file() and "trial_summary" in index.read_text()
    res = runner.invoke(app, ["validate", str(tmp_path / "bad.json"), "--report-out", str(tmp_path / "r.json")])
    assert res.exit_code == 1
    assert "REJECTED" in res.output and "prefix_hit_rate" in res.output
    assert orjson.loads((tmp_path / "r.json").read_bytes())["success"] is False
    res = runner.invoke(app, ["validate", str(tmp_path / "missing.json")])
    assert res.exit_code == 2 and "missing.json" in res.output


def test_stored_trial_through_gx_postgres_datasource(database_url):
    """The suites also run on loaded tables, and agree with the in-memory run."""
    from servetune.ingest import load_result
    from servetune.validation.stored import validate_stored
    from warehouse_fixtures import migrated

    migrated(database_url)
    good, bad = make_trial(trial_id="stored-good"), make_trial(trial_id="stored-bad")
    _ttft_after_e2e(bad)
    for t in (good, bad):
        load_result(database_url, t, validate=False)
    ok = validate_stored("stored-good", database_url=database_url)
    assert ok.success, _failed(ok)
    assert len(ok.results) == len(validate(good).results)
    rejected = validate_stored("stored-bad", database_url=database_url)
    assert _failed(rejected) == _failed(validate(bad))
    with pytest.raises(LookupError, match="no trial"):
        validate_stored("nope", database_url=database_url)


def test_a_short_gpu_curve_gets_one_verdict_in_memory_and_in_the_warehouse(database_url):
    """A sub-second curve (the correctness trial's) is not held to a median cadence, whether its samples
    are in the result or only in the warehouse's gpu_samples."""
    from servetune.ingest import load_result
    from servetune.validation.stored import validate_stored
    from warehouse_fixtures import migrated

    migrated(database_url)
    t = make_trial(trial_id="short-curve")
    t0 = t.summary.window_start_s
    base = t.gpu["samples"][0]
    t.gpu = {**t.gpu, "interval_ms": 100, "samples": [{**base, "t_s": round(t0 + dt, 3)}
                                                      for dt in (0.0, 0.01, 0.11, 0.12)]}  # median gap 10 ms
    t.summary.gpu_sample_interval_ms = 100
    cadence = [r for r in validate(t).results if r.expectation == "expect_column_median_to_be_between"]
    assert cadence and all(r.success for r in cadence)
    load_result(database_url, t, validate=False)
    stored = validate_stored(t.trial_id, database_url=database_url)
    assert _failed(stored) == _failed(validate(t))
    assert all(r.success for r in stored.results if r.expectation == "expect_column_median_to_be_between")


GPU_CASES = [  # (state, processes_at_start) -> the one verdict
    ("ok", [], True),
    ("ok", [{"pid": 1, "foreign": False}], True),
    ("ok", [{"pid": 1, "foreign": False}, {"pid": 4242, "foreign": True}], False),
    ("ok", [{"pid": 4242, "name": "python"}], None),  # the server's PIDs unknown: cannot tell
    ("simulated", [], True),
    ("no_gpu", [], None),
    ("ok", None, None),
]


def test_one_clean_gpu_rule_in_memory_and_in_the_warehouse(database_url):
    """servetune.gpu_summary.clean_at_start decides; a result stored without the verdict (older trials) gets
    the same one from the checklist's frames and from the stored-trial SQL."""
    from servetune.gpu_summary import clean_at_start
    from servetune.ingest import load_result
    from servetune.validation.frames import build_frames
    from servetune.validation.stored import validate_stored
    from warehouse_fixtures import migrated

    migrated(database_url)
    for i, (state, procs, want) in enumerate(GPU_CASES):
        t = make_trial(trial_id=f"clean-rule-{i}")
        t.gpu = {**t.gpu, "state": state, "processes_at_start": procs}
        t.summary.gpu_clean_at_start = None  # as an older result stored it
        assert clean_at_start(t.gpu) is want, (state, procs)
        assert build_frames(t).summary["gpu_clean_at_start"].iloc[0] is want, (state, procs)
        load_result(database_url, t, validate=False)
        stored = validate_stored(t.trial_id, database_url=database_url)
        clean = [r for r in stored.results if r.checklist == "clean_gpu"]
        assert all(r.success for r in clean) is (want is True), (state, procs, clean)
        in_memory = [r.success for r in validate(t).results if r.checklist == "clean_gpu"]
        assert [r.success for r in clean] == in_memory, (state, procs)


def test_validate_takes_a_campaign_folder_judged_as_its_plan_asked(tmp_path):
    """`validate DIR` (as load, report and diagnose take one): every trial in DIR/trials, one row each, the
    plan's validation settings unless the command line says otherwise; exit 1 when any is rejected."""
    import json

    folder = tmp_path / "campaign"
    (folder / "trials").mkdir(parents=True)
    good, bad = make_trial(trial_id="dir-good", n=120), make_trial(trial_id="dir-bad", n=120)
    _ttft_after_e2e(bad)
    good.save(folder / "trials" / "dir-good.json")
    (folder / "experiment.json").write_text(json.dumps({"plan": {"validation": {"min_measured": 100}}}))
    res = CliRunner().invoke(app, ["--json", "validate", str(folder)])
    assert res.exit_code == 0, res.output  # 120 measured requests: enough for this plan's 100
    assert [(d["trial_id"], d["accepted"]) for d in orjson.loads(res.stdout)] == [("dir-good", True)]
    res = CliRunner().invoke(app, ["validate", str(folder), "--min-measured", "200"], env={"COLUMNS": "200"})
    assert res.exit_code == 1 and "0 of 1 trials accepted" in res.output and "measured_requests" in res.output
    bad.save(folder / "trials" / "dir-bad.json")
    res = CliRunner().invoke(app, ["validate", str(folder)], env={"COLUMNS": "200"})
    assert res.exit_code == 1 and "1 of 2 trials accepted" in res.output and "sanity_timings" in res.output
    empty = tmp_path / "empty"
    empty.mkdir()
    res = CliRunner().invoke(app, ["validate", str(empty)])
    assert res.exit_code == 2 and "no trial result in it" in res.output
