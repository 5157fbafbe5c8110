"""A campaign that once asked for the same trial without end (a real-time rate campaign on a busy host, kept in
tests/data/stuck-bisect): the band's biggest trial was INVALID (200 requests, warm-up 75, its client too busy);
its re-run, capped at the same 200 requests, took warm-up 23, so it never matched the level's size, never
counted, and was asked for again and again (92 times before the test was killed). The latest of the biggest
now sets the size, and a seed has a backstop on its runs."""

from __future__ import annotations

from pathlib import Path

import orjson

from servetune.plan import TuningPlan
from servetune.tuning import evidence
from servetune.tuning.decisions import next_trials
from servetune.tuning.state import CampaignState

DATA = Path(__file__).parent / "data" / "stuck-bisect"


def _kept() -> tuple[TuningPlan, CampaignState]:
    plan = TuningPlan.model_validate(orjson.loads((DATA / "plan.json").read_bytes()))
    return plan, CampaignState.model_validate_json((DATA / "state.json").read_bytes())


def _asks(plan: TuningPlan, state: CampaignState) -> tuple | None:
    d = next_trials(plan, state)
    return None if d.done else [(t.stage, t.rate, t.seed_offset) for t in d.trials][0]


def test_a_valid_re_run_of_an_invalid_trial_counts_and_the_campaign_moves_on() -> None:
    plan, state = _kept()
    last = state.outcomes[-1]
    assert (last.stage, last.rate, last.requests, last.warmup, last.valid) == ("bisect", 25.0, 200, 23, True)
    assert state.outcomes[7].valid is False and (state.outcomes[7].requests, state.outcomes[7].warmup) == (200, 75)
    # it asked for ('bisect', 25.0, 0) again after each of these valid re-runs; now the first one counts
    assert _asks(plan, CampaignState(outcomes=state.outcomes[:9])) != ("bisect", 25.0, 0)
    assert _asks(plan, state) != ("bisect", 25.0, 0)


def test_a_seed_is_never_asked_for_without_end(monkeypatch) -> None:
    """The backstop alone: with the size rule as it was (the first of the biggest), the runs of seed 0 at 25
    req/s stop being asked for once they pass the backstop."""
    plan, state = _kept()

    def first_of_the_biggest(plan, state, level):  # the old rule, which went round in a circle
        band = evidence.size_band(plan, level)
        trials = [o for o in state.outcomes if o.stage not in evidence.UNPAIRED
                  and evidence.size_band(plan, o.level) == band]
        return max(trials, key=lambda o: o.requests, default=None)

    monkeypatch.setattr(evidence, "level_size", first_of_the_biggest)
    assert _asks(plan, state) == ("bisect", 25.0, 0)  # the circle, as it was: 3 valid re-runs did not count
    runs = list(state.outcomes)
    limit = evidence.MAX_RUNS_PER_SEED + plan.repeats.invalid_retries + plan.repeats.crash_retries
    while _asks(plan, CampaignState(outcomes=runs)) == ("bisect", 25.0, 0):
        runs.append(runs[-1].model_copy(update={"trial_id": f"again-{len(runs)}"}))
        assert sum(o.rate == 25.0 and o.seed_offset == 0 for o in runs) <= limit + 1
