"""The seed's VLM rate campaign on real SGLang 0.5.17 on one H100 80GB, second window of 2026-12-06 (docs/gpu.md,
"The second window"): one server for the whole campaign (the run detached across device calls), adaptive repeats,
the robustness reserve and trials capped at 270 requests. It ran out of its 15 GPU minutes in the bisection again,
at 11.5 req/s on two seeds; the kept state replays to the same budget answer and says what it left unmeasured."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from kept_archives import checklist_again, kept_state, unpack

from servetune.plan import load_plan
from servetune.tuning import next_trials
from servetune.tuning.costs import restart_cost
from servetune.tuning.plan_identity import check_same_plan
from servetune.tuning.verdict import judge

DATA = Path(__file__).resolve().parent / "data" / "gpu-h100-campaigns" / "2026-12-06b"
PLAN = DATA / "gpu-h100-vlm-rate.yaml"


@pytest.fixture(scope="module")
def kept(tmp_path_factory) -> Path:
    return unpack(tmp_path_factory.mktemp("gpu-h100-b"), DATA / "tune-vlm.tar.xz") / "tune-vlm"


def test_one_server_served_the_whole_campaign_and_its_start_up_is_kept_apart(kept) -> None:
    experiment = orjson.loads((kept / "experiment.json").read_bytes())
    plan = load_plan(PLAN)
    check_same_plan(experiment, plan, kept)
    state = kept_state(kept)
    starts = [o for o in state.outcomes if o.restarted]
    assert len(starts) == 1 and starts[0].stage == "correctness"  # no restart at a device call's boundary
    assert state.server_starts == 1 and 150 < state.startup_seconds < 200  # the first start and its warm-up
    # the only start was the machine's first (kernel compiles): a restart is priced at the plan's 90 s, not 182
    assert restart_cost(plan, state) == plan.budget.restart_cost_s == 90
    assert experiment["gpu_seconds"] == pytest.approx(state.gpu_seconds, abs=0.01)
    assert 15 * 60 <= state.gpu_seconds < 15.5 * 60  # the last trial ran past the budget by under 20 s


def test_every_kept_trial_gets_the_same_checklist_verdict_again(kept) -> None:
    plan = load_plan(PLAN)
    outcomes = kept_state(kept).outcomes
    assert sum(o.rejected for o in outcomes) == 2  # both at 12 req/s: the window was not one steady state
    for o, again in checklist_again(kept, plan):
        assert (again.status == "rejected") == o.rejected, (o.stage, o.level, again.failure_reason)
        if o.rejected:
            assert o.rate == 12.0 and "[one_window:" in (o.failure_reason or "")


def test_the_budget_answer_is_11_5_req_s_on_two_seeds_and_it_says_what_it_left(kept) -> None:
    """4 and 8 req/s pass, 12 fails p99 TPOT on its second seed (47.8 ms > 40), 10 and 11 pass on all three seeds,
    11.5 on two before the budget ran out: a budget answer at 11.5 req/s; with the budget raised the walk goes on
    with 11.5's third seed."""
    plan = load_plan(PLAN)
    state = kept_state(kept)
    verdicts: dict[float, list[tuple[int, str]]] = {}
    for o in state.outcomes:
        if o.stage != "correctness" and o.valid:
            verdicts.setdefault(o.rate, []).append((o.seed_offset, judge(o, plan.sla).kind))
    assert (1, "sla") in verdicts[12.0]
    for rate in (10.0, 11.0):
        assert sorted(verdicts[rate]) == [(0, "pass"), (1, "pass"), (2, "pass")]
    assert sorted(verdicts[11.5]) == [(0, "pass"), (1, "pass")]
    d = next_trials(plan, state)
    assert d.done and d.recommendation is not None and "GPU budget spent" in d.reason
    rec = d.recommendation
    assert rec.rate == 11.5 and rec.repeats == 2 and rec.config == plan.engine_flags()
    (left,) = [line for line in rec.explanation if line.startswith("left unmeasured: ")]
    assert "2 of 3 seed(s)" in left and "the refinement of chunked-prefill-size, mm-processor-worker-num" in left
    assert "robustness" in left and not state.by_stage("refine") and not state.by_stage("robustness")
    raised = plan.model_copy(update={"budget": plan.budget.model_copy(update={"max_gpu_minutes": 60})})
    (spec,) = next_trials(raised, state).trials
    assert (spec.stage, spec.rate, spec.seed_offset) == ("bisect", 11.5, 2)
