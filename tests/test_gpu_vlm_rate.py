"""A staged rate-mode campaign of a VLM on real SGLang 0.5.17 on an H200 (docs/gpu.md, "A staged VLM campaign"):
what it measured, the checklist's verdicts under the current rules, and what the campaign does next.

tests/data/gpu-h200-vlm/2026-12-05-rate/tune-rate.tar.xz came from two calls of
``bash scripts/gpu-h200-vlm.sh tune:rate=plans/gpu-h200-vlm-rate.yaml`` (the second resumed the first): 18 trials,
17.6 GPU minutes, paused by the session's device budget in the bisection, before the refinement. Trial files keep
every request record without per-chunk arrays."""

from __future__ import annotations

import tarfile
from pathlib import Path

import orjson
import pytest
from kept_archives import checklist_again
from typer.testing import CliRunner

from servetune.cli import app
from servetune.plan import load_plan
from servetune.tuning import CampaignState, next_trials
from servetune.tuning.plan_identity import check_same_plan
from servetune.tuning.verdict import judge

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data" / "gpu-h200-vlm" / "2026-12-05-rate"
PLAN = REPO / "plans" / "gpu-h200-vlm-rate.yaml"


@pytest.fixture(scope="module")
def kept(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gpu-vlm-rate")
    with tarfile.open(DATA / "tune-rate.tar.xz") as tar:
        tar.extractall(root, filter="data")
    return root / "tune-rate"


@pytest.fixture(scope="module")
def state(kept) -> CampaignState:
    return CampaignState.model_validate_json((kept / "state.json").read_bytes())


def test_the_campaign_ran_this_plan(kept) -> None:
    experiment = orjson.loads((kept / "experiment.json").read_bytes())
    plan = load_plan(PLAN)
    check_same_plan(experiment, plan, kept)  # raises unless only the GPU budget changed (raised to resume)
    assert plan.rate_mode and plan.workload.images is not None
    assert "mm-processor-worker-num" in plan.stages.refine.grid


def test_every_trial_passes_the_current_checklist_but_the_overloaded_level(kept, state) -> None:
    """The checklist, run again here on every kept trial: all accepted but the two trials at 16 req/s, which
    have no steady window (the server fell behind: offered 16, completed far fewer). The correctness check
    (two requests, both with an image) was rejected when it ran, by a length check that needs a text-only
    request; that check now applies only where the trial has one."""
    verdicts = {o.trial_id: again for o, again in checklist_again(kept, load_plan(PLAN))}
    rejected = [o for o in state.outcomes if verdicts[o.trial_id].status == "rejected"]
    assert [(o.stage, o.rate) for o in rejected] == [("ramp", 16.0), ("ramp", 16.0)]
    assert all("one_window" in verdicts[o.trial_id].failure_reason for o in rejected)
    correctness = next(o for o in state.outcomes if o.stage == "correctness")
    assert verdicts[correctness.trial_id].status == "ok"


def test_capacity_is_12_on_every_seed_and_the_walk_goes_on_at_12_5(state) -> None:
    """12 req/s passes on all three seeds; 13 and 14 pass on two and fail on the third (the server falls behind:
    latency per output token more than doubles within the window), so the capacity lies in [12, 13) and the
    next trial bisects at 12.5; the refinement (the chunk, then the processor threads) was not reached."""
    plan = load_plan(PLAN)
    passed = {}
    for o in state.outcomes:
        if o.stage != "correctness" and o.valid and o.status == "ok":
            passed.setdefault(o.rate, []).append(judge(o, plan.sla).passed)
    assert passed[4.0] == passed[8.0] == passed[12.0] == [True, True, True]
    assert sorted(passed[13.0]) == sorted(passed[14.0]) == [False, True, True]
    fails = [o for o in state.outcomes if o.rate in (13.0, 14.0) and not judge(o, plan.sla).passed]
    assert {o.seed_offset for o in fails} == {2} and all(judge(o, plan.sla).kind == "overload" for o in fails)
    d = next_trials(plan, state)
    assert not d.done
    (spec,) = d.trials
    assert (spec.stage, spec.rate) == ("bisect", 12.5)


def test_diagnose_names_the_front_end_as_where_the_first_token_waits(kept, state) -> None:
    """At 12 req/s the first token waits in the server after the scheduler's queue (the multimodal front end,
    the vision encoder, the prefill), not in the queue."""
    o = next(o for o in state.outcomes if o.rate == 12.0)
    res = CliRunner().invoke(app, ["diagnose", "--json", str(kept / "trials" / f"{o.trial_id}.json")])
    assert res.exit_code == 0, res.output
    (top,) = [f for f in orjson.loads(res.output) if f["kind"].startswith("images.ttft_")]
    assert top["kind"] == "images.ttft_in_server_after_queue", top
    assert top["evidence"]["queue"] < 0.1 * top["evidence"]["in_server_after_queue"]
