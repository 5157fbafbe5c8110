"""Real SGLang 0.5.17 on an H200 (docs/gpu.md): the kept results load, validate, and decide as documented.

The data in tests/data/gpu-h200-sglang came from scripts/gpu-h200-sglang.sh on the lent machine: a
repeat study (one closed-loop trial repeated with different workload seeds); campaign tune-a (an
earlier plan, cut by the call's time limit at its first refinement trial); tune-b and tune-c, the
same plan (plans/gpu-h200-sglang.yaml) run twice, each across several calls with --stop-after and
--resume, both to the same recommendation; three open-loop trials (bench --rate) and servetune beside
sglang.bench_serving on one server; and SGLang 0.5.17's own parser output (sglang_probe.py check),
recorded."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from kept_archives import unpack

from bench_modules import bench_module
from servetune.plan import TuningPlan, load_plan
from servetune.result import TrialResult
from servetune.stats import compare, spread
from servetune.tuning import CampaignState, next_trials
from servetune.validation import validate

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data" / "gpu-h200-sglang"
PLAN = REPO / "plans" / "gpu-h200-sglang.yaml"


def study() -> dict:
    return orjson.loads((DATA / "study.json").read_bytes())


def printed(level: int) -> list[dict]:
    return [p for p in study()["printed"] if p["level"] == level]


def test_the_repeat_study_states_its_noise() -> None:
    """Five seeds at concurrency 16 and 128, four at 64 (the fifth was cut by the call's limit)."""
    c16, c64, c128 = printed(16), printed(64), printed(128)
    assert (len(c16), len(c64), len(c128)) == (5, 4, 5)
    assert all(p["valid"] for p in c16 + c64)
    g16, g64 = spread([p["goodput_rps"] for p in c16]), spread([p["goodput_rps"] for p in c64])
    assert g16.cv < 0.02 and g64.cv < 0.03  # measured: 1.2% and 2.6%
    ttft64 = spread([p["ttft_p99_ms"] for p in c64])
    assert 0.03 < ttft64.cv < 0.1  # p99s are noisier than rates: 4.6%
    # at 128 the p99 TPOT straddles the plan's 25 ms bound: a single trial could say either
    tpot128 = [p["tpot_p99_ms"] for p in c128]
    assert min(tpot128) < 25 < max(tpot128)
    # levels 16 and 64 differ far beyond their noise
    assert compare(g64, g16, min_change=0.02).outcome == "better"


def test_study_trials_carry_real_sglang_and_validity_figures() -> None:
    rows = study()["trials"]
    assert {r["level"] for r in rows} == {16, 64, 128}
    for r in rows:
        s = r["summary"]
        assert r["environment"]["gpu_model"] == "NVIDIA H200"
        assert s["window_source"] == "steady" and s["window_s"] >= 10
        assert s["completions_in_window"] >= s["completions_needed"]
        assert s["in_flight_min"] == pytest.approx(r["level"], rel=0.02)
        assert s["goodput_rps"] <= s["request_throughput"]
        if "output_tokens_per_s_arrived" in s:  # measured after token throughput moved to the window's set
            assert s["tokens_per_request"] == pytest.approx(s["output_len"]["mean"])
        assert abs(s["prefix_hit_rate"] - s["prefix_hit_rate_server"]) < 0.02  # usage vs SGLang's counters
    # four c=128 repeats were INVALID by the arrivals rule when it counted re-tokenised chunk text,
    # not the server's tokens (fixed since: servetune.metrics.Chunks.arrived_in_usage_units)
    c128 = [r for r in rows if r["level"] == 128]
    assert sum(not r["summary"]["valid"] for r in c128) == 4
    assert all("arrived in the window" in r["summary"]["invalid_reasons"][0] for r in c128 if not r["summary"]["valid"])


def test_the_campaign_replays_to_the_same_ceiling_with_repeats() -> None:
    plan = TuningPlan.model_validate(orjson.loads((DATA / "tune-a" / "experiment.json").read_bytes())["plan"])
    state = CampaignState.model_validate_json((DATA / "tune-a" / "state.json").read_bytes())
    assert sum(o.concurrency == 64 for o in state.outcomes) == 3
    assert sum(o.concurrency == 128 for o in state.outcomes) == 3
    assert len({o.seed_offset for o in state.outcomes if o.concurrency == 128}) == 3  # a new seed per repeat
    assert all(o.valid for o in state.outcomes if o.stage != "correctness")
    d = next_trials(plan, state)  # 64 gains 21% over 32 on seed 0: far beyond the noise, no seed added at 32
    assert d.ceiling is not None and (d.ceiling.level, d.ceiling.kind, d.ceiling.first_fail) == (64, "sla", 128)
    assert len(d.ceiling.pass_trial_ids) == 3 and len(d.ceiling.fail_trial_ids) == 3 and d.ceiling.marginal == []
    assert "failed 3 of 3 seeds" in d.ceiling.reasons[0]
    (spec,) = d.trials  # where the call's time limit stopped it: the first refinement step
    assert spec.stage == "refine" and spec.flags.get("chunked-prefill-size") == 2048 and spec.concurrency == 64


def test_a_real_sglang_trial_is_accepted_and_loads(database_url) -> None:
    from servetune.ingest import load_result
    from warehouse_fixtures import migrated

    (path,) = (DATA / "tune-a" / "trials").glob("*.json")
    trial = TrialResult.read(path)
    assert trial.summary.valid is True and trial.load["concurrency"] == 64
    report = validate(trial, min_measured=100)
    assert report.success, [(o.checklist, o.column) for o in report.results if not o.success]
    migrated(database_url)
    load_result(database_url, trial, validate=False)
    from sqlalchemy import text

    from servetune.warehouse import db

    eng = db.engine(database_url)
    try:
        with eng.connect() as conn:
            row = conn.execute(text("SELECT valid, completions_in_window, in_flight_mean, scenario FROM trials"
                                    " WHERE trial_id = :t"), {"t": trial.trial_id}).one()
            n = conn.execute(text("SELECT count(*) FROM request_records WHERE trial_id = :t"),
                             {"t": trial.trial_id}).scalar()
    finally:
        eng.dispose()
    assert row.valid is True and row.completions_in_window == trial.summary.completions_in_window
    assert row.scenario == "closed_loop" and row.in_flight_mean == pytest.approx(64, rel=0.01)
    assert n == len(trial.records)


@pytest.fixture(scope="module")
def campaigns(tmp_path_factory) -> dict[str, Path]:
    """tune-b and tune-c unpacked (kept as .tar.xz: their trial files hold every request record)."""
    root = unpack(tmp_path_factory.mktemp("gpu-campaigns"), DATA / "tune-b.tar.xz", DATA / "tune-c.tar.xz")
    return {name: root / name for name in ("tune-b", "tune-c")}


def replay(folder: Path):
    experiment = orjson.loads((folder / "experiment.json").read_bytes())
    plan = load_plan(PLAN).with_repeats(3)
    state = CampaignState.model_validate_json((folder / "state.json").read_bytes())
    return experiment, plan, state, next_trials(plan, state)


def test_the_kept_campaigns_ran_this_plan(campaigns) -> None:
    """The plan file is the one both ran (tune-c can still be resumed from its kept state)."""
    from servetune.tuning.plan_identity import plan_digest

    for folder in campaigns.values():
        experiment, plan, _, _ = replay(folder)
        assert experiment["plan_digest"] == plan_digest(plan)
        assert experiment["plan"]["engine"]["version"] == "0.5.17"


def test_the_two_campaigns_agree(campaigns) -> None:
    """Kept answers (the earlier rules): same ceiling (64: level 128 fails its SLA in every repeat in both), the
    same refinement verdicts
    (chunked-prefill-size 16384 and schedule-conservativeness 0.7 below the defaults; max-running-requests
    64 serves about 8% more but fails the p99 TTFT bound in most of its repeats: tune-b 3 of 3 valid,
    tune-c 3 of 4) and so the same recommendation: SGLang's defaults at concurrency 64, a tie between runs."""
    recs = {}
    for name in ("tune-b", "tune-c"):
        experiment, plan, state, decision = replay(campaigns[name])
        assert experiment["status"] == "done"
        # measured under the earlier rules: level 32 on one seed, refinement candidates at 433 requests against
        # the incumbent's 637 at the same level. The current rules pair 64 with 32 seed by seed, with the
        # campaign's own noise: in tune-b (128's goodput swung 20.0-24.4 between seeds) 32 -> 64 is undecided
        # on one seed, so level 32 gets seed 2; in tune-c it is decided and the refinement reopens with the
        # first candidate at 64's size. A budget spent there answers from pooled evidence: the defaults at 64,
        # not max-running-requests 64 (its seed 0 passed; it fails p99 TTFT by majority)
        (spec,) = decision.trials
        ref = next(o for o in state.outcomes if o.stage == "ramp" and o.concurrency == spec.concurrency)
        assert (spec.stage, spec.concurrency, spec.seed_offset) == (
            ("ramp", 32, 1) if name == "tune-b" else ("refine", 64, 0))
        assert (spec.requests, spec.warmup) == (ref.requests, ref.warmup)  # the level's one size
        spent = plan.model_copy(update={"budget": plan.budget.model_copy(
            update={"max_gpu_minutes": state.gpu_seconds / 60})})
        rec = next_trials(spent, state).recommendation
        assert rec is not None and rec.concurrency == 64 and rec.repeats == 3
        assert rec.config == {"attention-backend": "triton", "sampling-backend": "pytorch",
                              "mem-fraction-static": 0.8, "cuda-graph-max-bs": 160}
        recs[name] = orjson.loads((campaigns[name] / "recommendation.json").read_bytes())
        assert (recs[name]["concurrency"], recs[name]["config"]) == (
            64, {"attention-backend": "triton", "sampling-backend": "pytorch", "mem-fraction-static": 0.8,
                 "cuda-graph-max-bs": 160})
        assert recs[name]["repeats"] == 3 and recs[name]["goodput_cv"] < 0.05
        mrr = [o for o in state.outcomes if o.stage == "refine" and o.valid and "max-running-requests" in o.flags]
        fails = [o for o in mrr if o.summary.ttft_ms.p99 > 1500]
        assert len(mrr) >= 3 and len(fails) > len(mrr) / 2
    (sb, sc) = (replay(campaigns[n])[2] for n in ("tune-b", "tune-c"))

    def refine_goodput(state, flag):
        return [o.summary.goodput_rps for o in state.outcomes if o.stage == "refine" and o.valid and flag in o.flags]

    ramp64 = {n: spread([o.summary.goodput_rps for o in s.outcomes if o.stage == "ramp" and o.concurrency == 64])
              for n, s in (("b", sb), ("c", sc))}
    assert compare(ramp64["b"], ramp64["c"], min_change=0.02).outcome == "tie"  # the same config, twice
    for flag in ("chunked-prefill-size", "schedule-conservativeness"):
        for state, name in ((sb, "b"), (sc, "c")):
            (g,) = refine_goodput(state, flag)
            assert g < ramp64[name].mean  # neither step beat the defaults, in either run
    for state in (sb, sc):  # max-running 64 serves more; its p99 TTFT is what rejects it
        assert min(refine_goodput(state, "max-running-requests")) > 1.05 * ramp64["b"].mean


def test_every_trial_of_a_campaign_loads_and_the_invalid_ones_are_rejected(campaigns, database_url) -> None:
    """All 17 trials of tune-b into the warehouse: the valid ones accepted by the checklist, the four
    INVALID ones (window not steady) kept and marked rejected; hit rate from usage vs SGLang's counters."""
    from sqlalchemy import text

    from servetune.ingest import load_result
    from servetune.warehouse import db
    from warehouse_fixtures import migrated

    migrated(database_url)
    report = load_result(database_url, campaigns["tune-b"], min_measured=100)  # rules: those each trial ran under
    assert report.errors == [] and len(report.trials) == 17
    eng = db.engine(database_url)
    try:
        with eng.connect() as conn:
            rows = conn.execute(text("SELECT trial_id, status, valid, stage FROM trials WHERE experiment_id = :e"),
                                {"e": report.experiment_id}).all()
    finally:
        eng.dispose()
    by_status = {}
    for r in rows:
        by_status.setdefault(r.status, []).append(r)
    assert all(r.valid or r.stage == "correctness" for r in by_status["ok"]) and len(by_status["ok"]) == 13
    assert {r.valid for r in by_status["rejected"]} == {False} and len(by_status["rejected"]) == 4
    assert "correctness" in {r.stage for r in by_status["ok"]}  # a check, not a measurement: no window to judge
    for f in (campaigns["tune-b"] / "trials").glob("*.json"):
        s = TrialResult.read(f).summary
        if s.valid and s.requests_measured >= 100:
            assert abs(s.prefix_hit_rate - s.prefix_hit_rate_server) < 0.02


def test_a_plan_for_0_5_17_validates_against_its_recorded_parser(tmp_path, monkeypatch) -> None:
    """The shipped 0.5.17 catalogue came from that version's own parser; the recorded probe output
    (sglang_probe.py check on the H200) is what the runner answers, and it is adopted and cached."""
    import lzma

    from servetune.engines.catalog import catalog_for, nearest_version
    from servetune.engines.sglang import adopt_runner_version, interpret_parser_check

    plan = load_plan(PLAN)
    assert plan.engine.catalog.label == "sglang 0.5.17"
    assert nearest_version("sglang", "0.5.16") == "0.5.15" and nearest_version("sglang", "0.5.1") == "0.5.5"
    ok = lzma.open(DATA / "probe-check-0.5.17.json.xz").read().decode()
    refused = lzma.open(DATA / "probe-check-refused-0.5.17.json.xz").read().decode()
    bad = interpret_parser_check(2, refused, "", "0.5.17")
    assert bad.checked and not bad.ok and bad.error == "unrecognized arguments: --no-such-flag 1"
    monkeypatch.setenv("SERVETUNE_CATALOG_CACHE", str(tmp_path))
    unversioned = plan.engine.model_copy(update={"version": None})
    verdict = interpret_parser_check(0, ok, "", None)
    assert verdict.ok and verdict.version == "0.5.17" and len(verdict.catalog["flags"]) == 474
    adopted = adopt_runner_version(unversioned, verdict)
    assert adopted.version == "0.5.17" and adopted.catalog.version == "0.5.17"
    assert list(tmp_path.iterdir()) == []  # a shipped catalogue of that version wins over a cache
    # a version servetune does not ship: the runner's own catalogue is cached and renders the argv
    future = orjson.loads(ok)
    future["version"] = future["catalog"]["version"] = "0.5.18"
    verdict = interpret_parser_check(0, orjson.dumps(future).decode(), "", "0.5.17")
    assert verdict.ok and "the runner has 0.5.18" in verdict.note
    adopted = adopt_runner_version(plan.engine, verdict)
    assert (tmp_path / "sglang-0.5.18.yaml").is_file() and catalog_for("sglang", "0.5.18").version == "0.5.18"
    assert adopted.launch_argv(host="127.0.0.1", port=1)[-8:] == plan.engine.launch_argv(host="127.0.0.1", port=1)[-8:]


def _archive(name: str, tmp_path: Path) -> Path:
    return unpack(tmp_path, DATA / f"{name}.tar.xz") / name


def test_open_loop_on_real_sglang_measures_the_rate_its_schedule_offered(tmp_path) -> None:
    """`servetune bench --rate` at 8, 16 and 24 Poisson req/s on real SGLang, each trial VALID when run.
    Re-summarised with today's open-loop set (the window's arrivals), the measured rate is the
    schedule's own within 1%, and the Poisson draw itself was 2-6% above the nominal rate; the
    stored figures (the set that completed in the window) are 1-6% below the schedule's."""
    from servetune.metrics import summarize
    from servetune.validity import ValidityRules

    folder = _archive("openloop", tmp_path) / "trials"
    seen = []
    for f in sorted(folder.glob("*.json")):
        t = TrialResult.read(f)
        assert t.summary.valid and t.summary.scenario == "open_loop" and t.load["mode"] == "rate"
        assert t.summary.window_s >= 25 and t.summary.errors_by_class == {}
        now = summarize(t.records, load=t.load, rules=ValidityRules(**t.summary.validity_rules), sla=None, gpu=None,
                        server=None, lengths_exact=True)
        offered, scheduled = t.load["rate"], now.scheduled_rate
        assert 1.02 < scheduled / offered < 1.06
        assert now.request_throughput == pytest.approx(scheduled, rel=0.01)
        assert 0.94 < t.summary.request_throughput / scheduled < 0.99
        assert now.sustained is True and now.latency_growth < 1.5
        seen.append(offered)
    assert sorted(seen) == [8.0, 16.0, 24.0]


def test_servetune_and_bench_serving_agree_where_their_definitions_do(tmp_path) -> None:
    """Both clients on one SGLang server, same shape, c=16 and 64: throughput apart only by the spans
    (servetune's steady window vs bench_serving's whole run), TPOT and ITL median within 5%, and
    bench_serving's own gaps re-read by servetune's ITL rule within 3% of servetune's median."""
    import numpy as np

    side = bench_module("bench_serving_side_by_side")
    folder = _archive("benchserving", tmp_path)
    for level in (16, 64):
        st = orjson.loads((folder / f"servetune-c{level}.json").read_bytes())
        bs = side.read_bench_serving(folder / f"bench-serving-c{level}.jsonl")
        s = st["summary"]
        assert s["valid"] and bs["completed"] == s["requests_measured"]  # the same number of requests
        assert bs["duration"] > s["window_s"]  # bench_serving's span holds the ramp-up and the drain
        assert 1.0 < s["request_throughput"] / bs["request_throughput"] < 1.06
        assert s["tpot_ms"]["p50"] / bs["median_tpot_ms"] == pytest.approx(1, abs=0.05)
        assert s["itl_ms"]["p50"] / bs["median_itl_ms"] == pytest.approx(1, abs=0.05)
        assert s["itl_ms"]["p50"] / float(np.median(side.per_token_itl(bs))) == pytest.approx(1, abs=0.03)
        rows = side.table(level, st, bs)
        assert any(r.startswith("| TPOT median ms |") for r in rows)
