"""The tenth window on real SGLang 0.5.17, one H100 (docs/gpu.md, "The tenth window"): the seed's VLM campaign from
correctness to a recommendation on three seeds with its robustness check in 13.1 GPU minutes, its trials sized from
accepted trials only, then the weekly run from that answer on the same machine. Replayed from the kept state, so a
change in the rules that would read these trials differently fails here."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from kept_archives import assert_read_as_kept, kept_state, unpack

from servetune.plan import load_plan
from servetune.tuning import next_trials

DATA = Path(__file__).resolve().parent / "data" / "gpu-h100-campaigns"
WINDOW = DATA / "2026-12-07e"
PLANS = {"tune-vlm": "gpu-h100-vlm-rate.yaml", "tune-w": "gpu-h100-vlm-warm.yaml"}


@pytest.fixture(scope="module")
def kept(tmp_path_factory) -> Path:
    return unpack(tmp_path_factory.mktemp("gpu-h100-window10"), *(WINDOW / f"{n}.tar.xz" for n in PLANS))


def _plan(name: str):
    return load_plan(WINDOW / PLANS[name])


@pytest.mark.parametrize("name", sorted(PLANS))
def test_every_kept_trial_gets_the_same_checklist_verdict_again(kept, name) -> None:
    assert_read_as_kept(kept / name, _plan(name))


def test_the_vlm_campaign_finds_12_req_s_on_three_seeds_in_13_gpu_minutes(kept) -> None:
    """4 req/s on three seeds (its latency-growth interval reached 1.28, over the 1.25 a one-seed verdict allows),
    8 and 12 on three, 16 and 14 overloaded, 13 passing its first seed and failing its second (p99 TPOT 42.6 ms),
    80% of 12 under gamma 0.5 bursts passing. The refinement's one candidate (about 2.0 GPU min with its restart)
    did not fit the 1.9 left, and the recommendation says what it left unmeasured."""
    plan, state = _plan("tune-vlm"), kept_state(kept / "tune-vlm")
    assert [(o.stage, o.rate, o.seed_offset, o.rejected) for o in state.outcomes[1:]] == [
        *(("baseline", 4.0, k, False) for k in range(3)), *(("ramp", 8.0, k, False) for k in range(3)),
        ("ramp", 12.0, 0, False), ("ramp", 12.0, 1, True), ("ramp", 12.0, 1, False), ("ramp", 12.0, 0, False),
        ("ramp", 12.0, 2, False), ("ramp", 16.0, 0, True), ("ramp", 16.0, 0, True), ("bisect", 14.0, 0, True),
        ("bisect", 14.0, 0, True), ("bisect", 13.0, 0, False), ("bisect", 13.0, 1, True), ("bisect", 13.0, 1, False),
        ("robustness", 9.6, 0, False)]
    assert state.gpu_seconds == pytest.approx(783.3, abs=0.5) and state.startup_seconds == pytest.approx(180.3, abs=0.5)
    assert state.outcomes[-2].summary.tpot_ms.p99 == pytest.approx(42.6, abs=0.05)
    d = next_trials(plan, state)
    rec = d.recommendation
    assert d.done and rec is not None and rec.rate == 12.0 and rec.repeats == 3
    assert rec.trial_size is not None and (rec.trial_size.requests, rec.trial_size.warmup) == (184, 46)
    (check,) = rec.robustness
    assert check["passed"] and check["rate"] == 9.6
    text = " ".join(rec.explanation)
    assert "the refinement stopped: its next trial (about 2.0 GPU min) would end past the budget (13.1 of 15" in text
    assert "not measured: --mm-processor-worker-num 4 at 12 req/s" in text
    assert "bought with 13.1 GPU min over 20 trial(s)" in text
    assert rec.energy_per_output_token_j == pytest.approx(0.273, abs=0.002)
    # with the budget's room, the next trial is that candidate at the answer's rate and size
    roomy = plan.model_copy(update={"budget": plan.budget.model_copy(update={"max_gpu_minutes": 30})})
    (spec,) = next_trials(roomy, state).trials
    assert (spec.stage, spec.rate, spec.flags["mm-processor-worker-num"], spec.requests) == ("refine", 12.0, 4, 184)


def test_its_warm_ups_came_from_accepted_trials_and_its_trials_ran_shorter(kept) -> None:
    """The slow rejected trials (13 req/s seed 2: 10.8 s mean E2E, goodput 0.83) sized nothing after them: warm-ups
    stayed at 16-78 requests, and a trial at 12-13 req/s took 24-35 GPU s against the ninth window's 47-51."""
    state = kept_state(kept / "tune-vlm")
    slow = state.outcomes[17]
    assert (slow.rate, slow.rejected) == (13.0, True) and slow.summary.e2e_ms.mean > 10_000
    trials = [o for o in state.outcomes[1:] if o.stage != "robustness"]
    assert max(o.warmup for o in trials) == 78
    assert all(23 < o.gpu_seconds < 36 for o in trials if o.rate >= 12.0)


def test_the_weekly_run_from_it_walked_down_to_10_req_s_within_its_6_minutes(kept) -> None:
    """The first trial after the start was far behind (goodput 3.86 req/s at 12 offered; rejected); its re-run and
    seed 2 passed, seed 3 missed by a hair (p99 TPOT 40.0 ms): the walk went down to 8 (passing on one seed, clear),
    bisected 10 on two seeds before the 6 minutes ran out. Capacity here: 12 req/s at the edge, 10 with room."""
    plan, state = _plan("tune-w"), kept_state(kept / "tune-w")
    previous = orjson.loads((kept / "tune-vlm" / "recommendation.json").read_bytes())
    assert previous["trial_size"] == {"requests": 184, "warmup": 46}
    assert [(o.rate, o.seed_offset, o.requests, o.warmup, o.rejected) for o in state.outcomes[1:]] == [
        (12.0, 0, 184, 46, True), (12.0, 0, 200, 142, False), (12.0, 1, 200, 142, False),
        (12.0, 2, 200, 142, False), (8.0, 0, 145, 44, False), (10.0, 0, 200, 142, False), (10.0, 1, 200, 142, False)]
    assert state.outcomes[4].summary.tpot_ms.p99 == pytest.approx(40.0, abs=0.05)
    assert state.outcomes[0].startup_seconds == pytest.approx(86.7, abs=0.1)  # the machine's second start
    d = next_trials(plan, state, previous=previous)
    assert d.done and d.recommendation is not None and d.recommendation.rate == 10.0
    text = " ".join(d.recommendation.explanation)
    assert "GPU budget spent: 6.4 of 6 min" in text and "the answer stands on 2 of 3 seed(s)" in text
