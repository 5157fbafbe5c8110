"""Warm start (servetune.tuning.warm): a weekly run begins from the last accepted answer for the same service,
confirms it on every seed, then searches around it (down the ladder from it when it fails); the full walk when
nothing below it passes or the service changed. The
decisions are pure: hand-made response surfaces, the previous answer as the warehouse hands it over."""

from __future__ import annotations

import pytest

from servetune.result import TrialSummary
from servetune.tuning import CampaignState, TrialOutcome, next_trials, warm
from servetune.tuning.evidence import size_band
from servetune.tuning.sizing import size_trial
from test_tuning_decisions import make_plan, summary

REFINE = {"enabled": True, "radix_cache": False, "set_max_running": False, "extend_levels": 0,
          "grid": {"chunked-prefill-size": [2048, 4096, 8192]}}


def _drive(plan, surface, previous=None, max_steps: int = 200):
    state = CampaignState()
    for i in range(max_steps):
        d = next_trials(plan, state, previous=previous)
        if d.done:
            return d, state
        (spec,) = d.trials
        state = state.add(TrialOutcome(trial_id=f"t{i}", stage=spec.stage, concurrency=spec.concurrency,
                                       flags=spec.flags, requests=spec.requests, warmup=spec.warmup,
                                       seed_offset=spec.seed_offset, summary=surface(spec.flags, spec.concurrency,
                                                                                     spec.seed_offset),
                                       gpu_seconds=60))
    raise AssertionError("campaign did not finish")


def _surface(shift: float = 1.0):
    """TTFT bound 1,000 ms breaks above 64 streams (x ``shift``); chunk 4096 serves 8% more than the default."""
    def surface(flags, level: int, seed: int) -> TrialSummary:
        gain = 1.08 if flags.get("chunked-prefill-size") == 4096 else 1.0
        ttft = 400 if level <= 64 * shift else 1600
        return summary(thr=min(level, 64 * shift) * 0.05 * gain * (1 + 0.005 * seed), ttft=ttft)
    return surface


def _plan(**over):
    return make_plan(stages__refine=REFINE, repeats={"count": 3}, **over)


def test_a_warm_start_confirms_the_answer_and_searches_around_it_for_less() -> None:
    cold, s_cold = _drive(_plan(), _surface())
    assert cold.recommendation is not None
    assert cold.recommendation.concurrency == 64 and cold.recommendation.config == {"chunked-prefill-size": 4096}
    previous = {**cold.recommendation.model_dump(mode="json"), "experiment_id": "e" * 32, "changed": []}
    warm, s_warm = _drive(_plan(warm_start=True), _surface(), previous)
    rec = warm.recommendation
    assert rec is not None and (rec.concurrency, rec.config) == (64, {"chunked-prefill-size": 4096})
    first = [o for o in s_warm.outcomes if o.stage != "correctness"][:3]
    assert [(o.concurrency, o.flags, o.seed_offset) for o in first] == [(64, {"chunked-prefill-size": 4096}, k)
                                                                        for k in range(3)]
    assert not s_warm.by_stage("baseline")  # no walk from the bottom of the ladder
    # the level above fails on its first seed, as it did on all three when the answer was found: not moved
    assert {o.seed_offset for o in s_warm.outcomes if o.concurrency == 128} == {0}
    assert {o.seed_offset for o in s_cold.outcomes if o.concurrency == 128} == {0, 1, 2}
    # and the refinement searched around the answer: both neighbours of chunk 4096, one seed each (they lose)
    assert sorted(o.flags["chunked-prefill-size"] for o in s_warm.by_stage("refine")) == [2048, 8192]
    assert len(s_warm.outcomes) < len(s_cold.outcomes)
    assert any(line.startswith("ceiling at concurrency 64") and "warm start: the last accepted answer" in line
               for line in rec.explanation)


def test_a_warm_start_whose_answer_no_longer_holds_walks_down_from_it() -> None:
    """The service got slower (the bound now breaks above 32): 64 fails on its first seed, so the walk goes down
    the ladder from it (32 passes) instead of up from the baseline, and says why; the answer is the one a cold
    campaign gives, for fewer trials, and the refinement still searches around the old answer's flags."""
    previous = {"config": {"chunked-prefill-size": 4096}, "concurrency": 64, "experiment_id": "f" * 32, "changed": []}
    cold, s_cold = _drive(_plan(), _surface(0.5))
    warm, state = _drive(_plan(warm_start=True), _surface(0.5), previous)
    assert warm.recommendation is not None and cold.recommendation is not None
    assert warm.recommendation.concurrency == cold.recommendation.concurrency == 32
    assert warm.recommendation.config == cold.recommendation.config == {"chunked-prefill-size": 4096}
    assert not state.by_stage("baseline") and {o.concurrency for o in state.by_stage("ramp")} == {32, 64}
    assert len(state.outcomes) < len(s_cold.outcomes)
    text = " ".join(warm.recommendation.explanation)
    assert "no longer holds concurrency 64" in text and "the walk went down from there, to concurrency 32" in text


def test_a_warm_start_with_nothing_passing_below_its_answer_walks_the_whole_ladder() -> None:
    """Much slower (the bound breaks above 6 streams): every ladder level below 64 fails too, so the full walk
    runs, says why, and ends where a cold campaign does."""
    previous = {"config": {}, "concurrency": 64, "experiment_id": "f" * 32, "changed": []}
    cold, s_cold = _drive(_plan(), _surface(0.1))
    warm, state = _drive(_plan(warm_start=True), _surface(0.1), previous)
    # the walk down (64, 32, 16, 8), then the full walk's levels below the baseline, as the cold campaign's
    levels = {o.concurrency for o in state.outcomes if o.stage != "correctness"}
    assert levels == {o.concurrency for o in s_cold.outcomes if o.stage != "correctness"} | {16, 32, 64}
    assert (warm.recommendation is None) == (cold.recommendation is None)
    if cold.recommendation is not None:
        assert warm.recommendation.concurrency == cold.recommendation.concurrency
    why = " ".join(warm.recommendation.explanation if warm.recommendation else [warm.reason])
    assert "nothing below it on the ladder passes either: the full walk" in why


def test_a_changed_service_or_a_plan_without_warm_start_never_starts_warm() -> None:
    previous = {"config": {"chunked-prefill-size": 4096}, "concurrency": 64, "changed": ["sla"]}
    d = next_trials(_plan(warm_start=True), CampaignState(), previous=previous)
    assert d.trials[0].flags == {}  # the plan's own flags: the correctness check, then the walk from the baseline
    d = next_trials(_plan(), CampaignState(), previous={**previous, "changed": []})
    assert d.trials[0].flags == {}


@pytest.mark.parametrize("size", [None, "200+16", {"requests": 0, "warmup": 16}, {"requests": 200, "warmup": -1},
                                  {"requests": 200}, {"requests": 200, "warmup": 16, "extra": 1},
                                  {"requests": 10**9, "warmup": 16}, {"requests": True, "warmup": "16"}])
def test_a_trial_size_that_is_not_one_is_ignored_and_the_confirmation_sized_afresh(size) -> None:
    """last week's recommendation.json is outside input: a size it cannot mean is read as none (sized afresh, as
    the level's first trial of a campaign that has measured nothing)."""
    plan = _plan()
    afresh = size_trial(plan, CampaignState(), {}, size_band(plan, 64), "ramp")
    assert warm._size(plan, CampaignState(), {}, 64, {"trial_size": size}) == afresh
    assert "trial size" not in afresh[2]


def test_a_kept_trial_size_is_capped_by_this_plan() -> None:
    plan = _plan()
    requests, warmup, how = warm._size(plan, CampaignState(), {}, 64, {"trial_size": {"requests": 10**6, "warmup": 40}})
    assert (requests, warmup) == (plan.budget.max_requests_per_trial, 40) and "1000000+40" in how
