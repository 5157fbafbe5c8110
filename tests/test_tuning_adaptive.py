"""Adaptive repeats (``repeats.clear_margin``): seeds go where a decision is close. A verdict far from the SLA's
edge is settled on one seed; one near it gets every seed; an open loop's capacity gets every seed whatever its
margin, so the answer is the one every seed would give. The decisions are pure: hand-made response surfaces."""

from __future__ import annotations

from servetune.result import TrialSummary
from servetune.tuning import TrialOutcome
from servetune.tuning.evidence import clear
from test_tuning_decisions import make_plan, summary
from test_tuning_noise import drive
from test_tuning_paired import _drive_rate, _open_loop, _rate_plan


def _outcome(s: TrialSummary, rate: float | None = None) -> TrialOutcome:
    return TrialOutcome(trial_id="t", stage="ramp", concurrency=8, rate=rate, requests=200, summary=s)


def test_clear_means_far_from_every_bound_on_both_sides() -> None:
    plan = make_plan(repeats={"count": 3, "clear_margin": 0.5})
    assert clear(plan, _outcome(summary(thr=1, ttft=400, tpot=20)))  # 40% of both bounds
    assert not clear(plan, _outcome(summary(thr=1, ttft=400, tpot=30)))  # TPOT at 60% of its 50 ms
    assert not clear(plan, _outcome(summary(thr=1, ttft=1200, tpot=20)))  # a failure 1.2x the bound: near it
    assert clear(plan, _outcome(summary(thr=1, ttft=2500, tpot=20)))  # a failure beyond twice the bound
    assert clear(plan, _outcome(summary(thr=1, mem=0.95)))  # memory is not noise
    s = summary(thr=1, ttft=400, tpot=20)
    s.p99_interval_ms = {"ttft": [300.0, 620.0]}  # the p99 is clear, its interval is not
    assert not clear(plan, _outcome(s))
    assert not clear(make_plan(repeats={"count": 3}), _outcome(summary(thr=1, ttft=100)))  # off without a margin


def test_a_closed_loop_spends_seeds_only_where_the_verdict_is_close() -> None:
    """TTFT grows with the streams: 64 is the ceiling with its p99 at 90% of the bound (close: three seeds),
    128 fails at 2.5x the bound (clear: one seed settles it, where the full repeats ran three). The baseline lies
    far inside the SLA. The answer is the one the full repeats give, with fewer trials."""
    ttft = {1: 50, 8: 100, 16: 200, 32: 420, 64: 900, 128: 2500}
    thr = {1: 0.1, 8: 1.0, 16: 2.0, 32: 3.2, 64: 4.0, 128: 4.1}

    def surface(flags, level: int, seed: int) -> TrialSummary:
        return summary(thr=thr[level] * (1 + 0.01 * seed), ttft=ttft[level])

    full, asked_full = drive(make_plan(repeats={"count": 3}), surface)
    adaptive, asked = drive(make_plan(repeats={"count": 3, "clear_margin": 0.5}), surface)
    assert adaptive.recommendation is not None and full.recommendation is not None
    assert adaptive.recommendation.concurrency == full.recommendation.concurrency == 64
    assert len(asked) < len(asked_full)
    seeds = {lv: {t.seed_offset for t in asked if t.concurrency == lv} for lv in ttft}
    assert seeds[8] == {0} and seeds[64] == {0, 1, 2} and seeds[128] == {0}
    assert {t.seed_offset for t in asked_full if t.concurrency == 128} == {0, 1, 2}
    assert "settled on one seed" in adaptive.recommendation.explanation[-1]


def test_an_open_loop_capacity_holds_on_every_seed_whatever_its_margin() -> None:
    """Seed 2 breaks the TTFT bound from 6 req/s on; seeds 0 and 1 only from 12, and below their edge every seed
    sits at 40% of its bounds (clear). One seed per rate would climb to 11; the capacity must pass on all three,
    so the walk comes back down to where seed 2 holds: the same answer as the full repeats."""
    def surface(spec, state):
        edge = 6 if spec.seed_offset == 2 else 12
        return _open_loop(spec.rate, ttft=1500 if spec.rate >= edge else 400)

    d_full, _ = _drive_rate(_rate_plan(), surface)
    d, state = _drive_rate(_rate_plan(repeats={"count": 3, "clear_margin": 0.5}), surface)
    assert d.recommendation is not None and d_full.recommendation is not None
    assert d.recommendation.rate == d_full.recommendation.rate and 5 <= d.recommendation.rate < 6
    at = {o.seed_offset for o in state.outcomes if o.rate == d.recommendation.rate}
    assert at == {0, 1, 2}
    assert {o.seed_offset for o in state.outcomes if o.rate == 1} == {0}  # the baseline, far inside: one seed
