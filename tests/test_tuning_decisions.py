"""The pure tuning decisions on hand-made result sequences: no servers, no simulator."""

from __future__ import annotations

from collections.abc import Callable

from servetune.checklist_report import ExpectationOutcome, ValidationReport
from servetune.plan import TuningPlan, parse_plan
from servetune.result import Percentiles, TrialSummary
from servetune.tuning import CampaignState, Decision, TrialOutcome, next_trials
from servetune.tuning.ceiling import find_ceiling, judge
from servetune.tuning.recommend import diff_recommendations
from servetune.tuning.state import Ceiling, Flags, TrialSpec


def make_plan(**over) -> TuningPlan:
    data = {
        "name": "t", "model": "m",
        "sla": {"p99_ttft_ms": 1000, "p99_tpot_ms": 50, "max_error_rate": 0.01, "gpu_memory_limit": 0.9},
        "stages": {
            "baseline": {"concurrency": 8, "requests": 200},
            "ramp": {"levels": [16, 32, 64, 128], "requests": 200, "bisect": False},
            "refine": {"enabled": False},
        },
    }
    for path, value in over.items():
        node = data
        keys = path.split("__")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return parse_plan(data)


def summary(*, thr: float, ttft: float = 100.0, tpot: float = 20.0, err: float = 0.0, mem: float = 0.5,
            usage: float | None = None, retractions: float | None = None, queue: float | None = None) -> TrialSummary:
    return TrialSummary(
        requests_total=200, requests_measured=200, requests_ok=int(200 * (1 - err)),
        requests_failed=int(200 * err), error_rate=err, window_s=60.0,
        ttft_ms=Percentiles(count=200, p99=ttft), tpot_ms=Percentiles(count=200, p99=tpot),
        e2e_ms=Percentiles(count=200, p99=ttft + 100 * tpot), output_len=Percentiles(count=200, max=128),
        output_tokens_per_s=thr * 100, request_throughput=thr, goodput_rps=thr * (1 - err),
        gpu_mem_peak_fraction=mem, server_token_usage_max=usage, server_retractions=retractions,
        server_queue_reqs_max=queue, prefix_hit_rate=0.5,
    )


Surface = Callable[[Flags, int], TrialSummary | str]


def drive(plan: TuningPlan, surface: Surface, *, max_steps: int = 100,
          with_seed: bool = False) -> tuple[Decision, list[TrialSpec]]:
    """Run next_trials to completion, answering each trial from a hand-made response surface (called with the
    trial's seed offset too, ``with_seed``)."""
    state = CampaignState()
    asked: list[TrialSpec] = []
    for i in range(max_steps):
        d = next_trials(plan, state)
        if d.done:
            return d, asked
        assert len(d.trials) == 1
        spec = d.trials[0]
        assert not [o for o in state.measurements(spec.flags, spec.concurrency) if o.seed_offset == spec.seed_offset
                    and o.requests == spec.requests], "asked twice"
        asked.append(spec)
        s = surface(spec.flags, spec.concurrency, *([spec.seed_offset] if with_seed else []))
        if isinstance(s, str):
            o = TrialOutcome(trial_id=f"t{i}", stage=spec.stage, concurrency=spec.concurrency, flags=spec.flags,
                             status="failed", failure_reason=s, gpu_seconds=60, seed_offset=spec.seed_offset,
                             requests=spec.requests, warmup=spec.warmup)
        else:
            o = TrialOutcome(trial_id=f"t{i}", stage=spec.stage, concurrency=spec.concurrency, flags=spec.flags,
                             summary=s, gpu_seconds=60, seed_offset=spec.seed_offset, requests=spec.requests,
                             warmup=spec.warmup)
        state = state.add(o)
    raise AssertionError("campaign did not finish")


def levels_of(asked: list[TrialSpec], stage: str | None = None) -> list[int]:
    return [t.concurrency for t in asked if stage is None or t.stage == stage]


def linear(flags: Flags, level: int) -> TrialSummary:
    return summary(thr=level * 0.1)


def test_correctness_first_then_baseline_then_ramp_in_order() -> None:
    plan = make_plan()
    d, asked = drive(plan, lambda f, c: summary(thr=c * 0.1, mem=0.95 if c >= 64 else 0.5))
    assert [t.stage for t in asked] == ["correctness", "baseline", "ramp", "ramp", "ramp"]
    assert levels_of(asked) == [1, 8, 16, 32, 64]


def test_ceiling_at_the_memory_limit() -> None:
    plan = make_plan()
    d, asked = drive(plan, lambda f, c: summary(thr=c * 0.1, mem=0.95 if c >= 64 else 0.5))
    assert d.done and not d.failed
    assert d.ceiling is not None and d.ceiling.level == 32 and d.ceiling.kind == "memory"
    assert d.ceiling.first_fail == 64
    assert "GPU memory peak 0.950 > limit 0.9" in d.ceiling.reasons[0]
    assert d.recommendation is not None and d.recommendation.concurrency == 32


def test_ceiling_at_an_sla_breach_names_the_bound() -> None:
    plan = make_plan()
    d, _ = drive(plan, lambda f, c: summary(thr=c * 0.1, ttft=2500 if c >= 32 else 300))
    assert d.ceiling is not None and (d.ceiling.level, d.ceiling.kind) == (16, "sla")
    assert "p99 TTFT 2500.0 ms > 1000 ms" in d.ceiling.reasons[0]


def test_ceiling_on_a_plateau_stops_without_bisecting() -> None:
    plan = make_plan(stages__ramp__bisect=True)
    thr = {1: 0.1, 8: 1.0, 16: 2.0, 32: 3.0, 64: 3.05, 128: 3.1}
    d, asked = drive(plan, lambda f, c: summary(thr=thr[c]))
    assert d.ceiling is not None and (d.ceiling.level, d.ceiling.kind) == (32, "plateau")
    assert "2 levels in a row" in d.ceiling.reasons[0] and "+3.3%" in d.ceiling.reasons[0]  # 128 against 32
    assert not any(t.stage == "bisect" for t in asked)
    assert sorted(set(levels_of(asked))) == [1, 8, 16, 32, 64, 128]  # two flat levels make a plateau


def test_ceiling_at_an_erroring_level_and_at_a_failed_trial() -> None:
    plan = make_plan()
    d, _ = drive(plan, lambda f, c: summary(thr=c * 0.1, err=0.2 if c >= 32 else 0.0))
    assert d.ceiling is not None and (d.ceiling.level, d.ceiling.kind) == (16, "errors")
    assert "error rate 0.200 > 0.01" in d.ceiling.reasons[0]

    d, _ = drive(plan, lambda f, c: "server died: CUDA out of memory" if c >= 64 else summary(thr=c * 0.1))
    assert d.ceiling is not None and (d.ceiling.level, d.ceiling.kind) == (32, "failed")
    assert "CUDA out of memory" in d.ceiling.reasons[0]


def test_bisection_between_last_pass_and_first_fail() -> None:
    plan = make_plan(stages__ramp__bisect=True, stages__ramp__bisect_min_step=4)
    # the true limit is 52: 52 passes, 53+ breaks the TPOT bound
    d, asked = drive(plan, lambda f, c: summary(thr=c * 0.1, tpot=80 if c > 52 else 30))
    assert levels_of(asked, "bisect") == [48, 56, 52]
    assert d.ceiling is not None and d.ceiling.level == 52 and d.ceiling.first_fail == 56
    assert d.recommendation is not None and d.recommendation.concurrency == 52


def test_nothing_passes_searches_down_then_fails_with_reasons() -> None:
    plan = make_plan()
    d, asked = drive(plan, lambda f, c: summary(thr=c * 0.1, ttft=5000))
    assert d.done and d.failed and d.recommendation is None
    assert levels_of(asked, "bisect") == [4, 2, 1]
    assert "p99 TTFT" in d.reason


def test_all_levels_pass_reports_an_exhausted_ramp() -> None:
    d, _ = drive(make_plan(), linear)
    assert d.ceiling is not None and (d.ceiling.level, d.ceiling.kind) == (128, "exhausted")


def test_correctness_failure_stops_the_campaign() -> None:
    d, asked = drive(make_plan(), lambda f, c: "connection refused")
    assert d.failed and len(asked) == 1 and "connection refused" in d.reason


def test_stop_on_failure_recommends_the_best_so_far() -> None:
    plan = make_plan(on_trial_failure="stop")
    d, asked = drive(plan, lambda f, c: "engine crashed" if c == 32 else summary(thr=c * 0.1))
    assert levels_of(asked) == [1, 8, 16, 32]
    assert d.done and d.recommendation is not None and d.recommendation.concurrency == 16
    assert "on_trial_failure: stop" in d.reason


def test_budget_ends_the_ramp_early() -> None:
    plan = make_plan(budget={"max_gpu_minutes": 3})  # every trial costs 1 minute in drive()
    d, asked = drive(plan, linear)
    assert len(asked) == 3 and d.ceiling is not None and d.ceiling.kind == "budget"
    assert d.recommendation is not None and d.recommendation.concurrency == 16
    assert "GPU budget spent" in d.reason


def test_a_budget_spent_on_rejected_trials_says_nothing_is_recommended_and_why() -> None:
    """A host too busy to sample the GPU on time: the checklist rejects every trial (gpu_memory_curve), the
    budget runs out, and the reason says no trial passed and which item rejected them, never 'recommending
    from the trials so far' with no recommendation."""
    plan = make_plan(budget={"max_gpu_minutes": 4}, repeats={"count": 1, "invalid_retries": 0})
    state = CampaignState()
    found = ValidationReport(success=False, suites=["checklist"], gx_version="1", results=[
        ExpectationOutcome(suite="checklist", expectation="expect_column_values_to_be_between", column=c,
                           checklist=item, success=False) for item, c in (("gpu_memory_curve", "gpu_mem_max_gap_ms"),
                                                                          ("clean_gpu", "gpu_idle_mib"))])
    for i in range(4):
        d = next_trials(plan, state)
        assert not d.done, d.reason
        (spec,) = d.trials
        state = state.add(TrialOutcome(
            trial_id=f"t{i}", stage=spec.stage, concurrency=spec.concurrency, flags=spec.flags, status="rejected",
            failure_reason=found.failure_reason(),  # "validation failed: ... [clean_gpu: ...; gpu_memory_curve: ...]"
            summary=linear(spec.flags, spec.concurrency), gpu_seconds=60, seed_offset=spec.seed_offset,
            requests=spec.requests, warmup=spec.warmup))
    d = next_trials(plan, state)
    assert d.done and d.failed and d.recommendation is None
    assert "recommending" not in d.reason and "no trial passed, so nothing is recommended" in d.reason, d.reason
    assert "the checklist rejected 4 of 4 trial(s) (clean_gpu on 4, gpu_memory_curve on 4)" in d.reason, d.reason


def test_judge_lists_every_broken_limit() -> None:
    plan = make_plan()
    o = TrialOutcome(trial_id="x", stage="ramp", concurrency=8,
                     summary=summary(thr=1, ttft=2000, tpot=60, err=0.5, mem=0.99))
    v = judge(o, plan.sla)
    assert not v.passed and v.kind == "errors" and len(v.reasons) == 4


def test_ceiling_is_pure_and_idempotent() -> None:
    plan = make_plan()
    state = CampaignState()
    a = find_ceiling(plan, state, {})
    b = find_ceiling(plan, state, {})
    assert isinstance(a, TrialSpec) and a == b and a.stage == "baseline"
    assert isinstance(find_ceiling(plan, CampaignState(), {}), TrialSpec)
    assert not isinstance(a, Ceiling)


def test_decision_and_state_round_trip_as_json() -> None:
    plan = make_plan()
    d, _ = drive(plan, lambda f, c: summary(thr=c * 0.1, mem=0.95 if c >= 64 else 0.5))
    assert Decision.model_validate_json(d.model_dump_json()) == d
    st = CampaignState(outcomes=[TrialOutcome(trial_id="a", stage="ramp", concurrency=4, summary=linear({}, 4))])
    assert CampaignState.model_validate_json(st.model_dump_json()) == st


def test_diff_from_previous_lists_changed_flags_and_figures() -> None:
    d, _ = drive(make_plan(), lambda f, c: summary(thr=c * 0.1, mem=0.95 if c >= 64 else 0.5))
    rec = d.recommendation
    assert rec is not None
    prev = {"config": {"chunked-prefill-size": 4096}, "concurrency": 16, "goodput_rps": 1.6}
    diff = diff_recommendations(prev, rec)
    assert diff["config"] == {"chunked-prefill-size": {"old": 4096, "new": None}}
    assert diff["figures"]["concurrency"] == {"old": 16, "new": 32, "change": 1.0}
    assert abs(diff["figures"]["goodput_rps"]["change"] - 1.0) < 1e-9
    assert diff["same_config"] is False


# --- refinement -------------------------------------------------------------------------------

REFINE = {"enabled": True, "grid": {"chunked-prefill-size": [1024, 2048, 4096, 8192],
                                    "schedule-conservativeness": [0.3, 0.7, 1.0, 1.3]}}


def tuned_surface(*, retractions: float | None = None) -> Surface:
    """Goodput peaks at radix on, chunk 2048, conservativeness 0.7; level 64 breaks GPU memory."""
    chunk_score = {1024: 0.90, 2048: 1.0, 4096: 0.95, 8192: 0.85}
    cons_score = {0.3: 0.93, 0.7: 1.0, 1.0: 0.96, 1.3: 0.90, None: 0.96}

    def f(flags: Flags, level: int) -> TrialSummary:
        g = level * 0.1 * chunk_score[flags.get("chunked-prefill-size", 8192)]  # type: ignore[index]
        g *= cons_score[flags.get("schedule-conservativeness")]  # type: ignore[index]
        g *= 0.8 if flags.get("disable-radix-cache") else 1.0
        return summary(thr=g, mem=0.95 if level >= 64 else 0.5, retractions=retractions, usage=0.95, queue=3)

    return f


def test_refine_walks_radix_then_chunk_then_conservativeness_then_max_running() -> None:
    plan = make_plan(stages__refine=REFINE, engine={"kind": "sim", "args": {
        "chunked-prefill-size": 8192, "disable-radix-cache": True}})
    d, asked = drive(plan, tuned_surface())
    refine = [t for t in asked if t.stage == "refine"]
    assert "disable-radix-cache" not in refine[0].flags  # radix cache first
    assert [t.flags.get("chunked-prefill-size") for t in refine[1:4]] == [4096, 2048, 1024]  # TPOT-tight: down
    assert refine[-1].flags.get("max-running-requests") == 32  # max-running last
    assert len(refine) <= 10 < 16  # far from the 4 x 4 grid (x levels); a tie is also tried one level up
    assert any(t.concurrency == 64 and t.flags.get("max-running-requests") == 32 for t in refine)
    rec = d.recommendation
    assert rec is not None and rec.concurrency == 32
    # max-running-requests = 32 ties (the surface ignores it): a tie goes to the simpler config, said so
    assert rec.config == {"chunked-prefill-size": 2048, "schedule-conservativeness": 0.7}
    assert rec.ties and "max-running-requests 32: a tie" in rec.ties[-1] and "kept the incumbent" in rec.ties[-1]
    assert any("chunked-prefill-size 2048" in line for line in rec.explanation)
    assert any("token_usage peaked at 0.95" in line for line in rec.explanation)
    chosen = next(t for t in refine if t.flags == rec.config)
    assert rec.evidence_trial_ids[0] == asked_id(asked, chosen) and "t1" in rec.evidence_trial_ids
    assert rec.goodput_rps is not None and abs(rec.goodput_rps - 3.2) < 1e-9
    # what runs today (the plan's flags, radix off) against the answer, at its level, from the ramp's own trials
    vs = rec.vs_deployed
    assert vs is not None and vs["measured"] and vs["passed"] and vs["level"] == 32
    assert vs["config"]["disable-radix-cache"] == {"deployed": True, "answer": None}
    assert vs["config"]["chunked-prefill-size"] == {"deployed": 8192, "answer": 2048}
    assert abs(vs["goodput_rps"] - 3.2 * 0.85 * 0.96 * 0.8) < 1e-9 and abs(vs["change"] - (1 / 0.6528 - 1)) < 1e-9
    line = next(x for x in rec.explanation if x.startswith("against the plan's own flags"))
    assert "--disable-radix-cache True -> None" in line and "met the SLA (+53.2% for the answer)" in line


def test_the_answer_that_is_the_plans_own_flags_has_nothing_to_compare() -> None:
    d, _ = drive(make_plan(), lambda f, c: summary(thr=c * 0.1, mem=0.95 if c >= 64 else 0.5))
    assert d.recommendation is not None and d.recommendation.vs_deployed is None
    assert not any(x.startswith("against the plan's own flags") for x in d.recommendation.explanation)


def test_retractions_push_conservativeness_up_first() -> None:
    plan = make_plan(stages__refine=REFINE)
    d, asked = drive(plan, tuned_surface(retractions=30))  # 30 in a 60 s window: 30/min
    cons = [t.flags["schedule-conservativeness"] for t in asked
            if t.stage == "refine" and "schedule-conservativeness" in t.flags and "max-running-requests" not in t.flags]
    assert cons[0] == 1.0  # started above the middle, towards more conservative admission
    assert d.recommendation is not None
    assert any("retractions (30.0/min" in line for line in d.recommendation.explanation)


def test_refine_extends_the_level_when_the_tuned_config_holds_it() -> None:
    plan = make_plan(stages__refine=REFINE)

    def f(flags: Flags, level: int) -> TrialSummary:
        tuned = flags.get("chunked-prefill-size") == 2048
        return summary(thr=level * (0.105 if tuned else 0.1), tpot=30 if level <= 32 or (tuned and level <= 64) else 80)

    d, asked = drive(plan, f)
    assert d.ceiling is not None and d.ceiling.level == 32
    rec = d.recommendation
    assert rec is not None and rec.concurrency == 64 and rec.config["chunked-prefill-size"] == 2048
    assert any("holds concurrency 64" in line for line in rec.explanation)
    # the plan's flags were measured at 64 by the ramp, and failed there: the answer says so
    assert rec.vs_deployed is not None and rec.vs_deployed["measured"] and not rec.vs_deployed["passed"]
    assert any("at concurrency 64 they serve" in x and "missed the SLA" in x for x in rec.explanation)


def asked_id(asked: list[TrialSpec], spec: TrialSpec) -> str:
    """drive() names trial i ``t{i}``."""
    return f"t{asked.index(spec)}"
