"""Repeats and noise in the tuning decisions: ties stay ties, marginal levels get more repeats,
INVALID trials are re-run bigger and never decide, trials are sized to be valid.

The trials are answered from hand-made response surfaces whose noise depends on the repeat's
workload seed, so the answer is known: the decisions themselves are pure (no server, no simulator)."""

from __future__ import annotations

from collections.abc import Callable

from servetune.plan import TuningPlan
from servetune.stats import compare, spread
from servetune.tuning import CampaignState, Decision, TrialOutcome
from servetune.tuning.sizing import size_trial
from servetune.tuning.state import Flags, TrialSpec
from test_tuning_decisions import drive as decisions_drive, make_plan, summary

Surface = Callable[[Flags, int, int], object]  # (flags, level, seed offset) -> TrialSummary


def drive(plan: TuningPlan, surface: Surface, *, max_steps: int = 200) -> tuple[Decision, list[TrialSpec]]:
    return decisions_drive(plan, surface, max_steps=max_steps, with_seed=True)  # type: ignore[arg-type]


# +-4% goodput noise, a function of the workload seed (the repeat) and the config
NOISE = {None: [0.0, 0.02, -0.02, 0.01, -0.01], 0.7: [0.04, -0.03, 0.01, -0.02, 0.02]}
REFINE_ONE = {"enabled": True, "radix_cache": False, "set_max_running": False, "extend_levels": 0,
              "grid": {"schedule-conservativeness": [0.7]}}


def test_a_noisy_tie_is_a_tie_not_a_win() -> None:
    """The candidate's first trial is 4% up (beyond the 2% rule a single trial used to decide on),
    but paired over the incumbent's seeds the difference is inside the noise: kept the incumbent, said so."""
    plan = make_plan(stages__refine=REFINE_ONE, repeats={"count": 3})

    def surface(flags: Flags, level: int, seed: int):
        noise = NOISE[flags.get("schedule-conservativeness")][seed % 5]
        return summary(thr=level * 0.1 * (1 + noise), mem=0.95 if level >= 64 else 0.5)

    d, asked = drive(plan, surface)
    rec = d.recommendation
    assert rec is not None and rec.concurrency == 32
    assert rec.config == {}  # the incumbent (engine defaults), not the 4%-up single trial
    assert len(rec.ties) == 1 and "schedule-conservativeness 0.7: a tie within the noise" in rec.ties[0]
    assert "kept the incumbent" in rec.ties[0]
    cand = [t for t in asked if t.flags.get("schedule-conservativeness") == 0.7]
    seeds = [t.seed_offset for t in cand if t.concurrency == 32]
    assert seeds[:2] == [0, 1] and len(set(seeds)) == len(seeds)  # paired with the incumbent's seeds, each new
    # a tie at 32 is also tried one level up, where it fails GPU memory like the incumbent: kept
    assert [t.concurrency for t in cand if t.concurrency != 32] == [64]
    inc = [t for t in asked if t.concurrency == 32 and not t.flags]
    assert len(inc) >= 3 and len({t.seed_offset for t in inc}) == len(inc)
    assert rec.repeats >= 3 and rec.goodput_ci95 is not None and rec.goodput_ci95 > 0


def test_a_tie_that_holds_the_next_level_moves_the_ceiling() -> None:
    """Tied at the ceiling (the closed loop caps goodput), but passing one level up where the incumbent
    fails: the candidate wins at the higher level."""
    plan = make_plan(stages__refine=REFINE_ONE, repeats={"count": 1})

    def surface(flags: Flags, level: int, seed: int):
        tuned = flags.get("schedule-conservativeness") == 0.7
        return summary(thr=level * 0.1, ttft=900 if level < 64 or (tuned and level == 64) else 1500)

    d, _ = drive(plan, surface)
    assert d.ceiling is not None and d.ceiling.level == 32
    rec = d.recommendation
    assert rec is not None and rec.concurrency == 64 and rec.config == {"schedule-conservativeness": 0.7}
    assert any("holds concurrency 64" in line and "where the incumbent fails" in line for line in rec.explanation)


def test_holding_the_next_level_without_serving_more_is_not_a_win() -> None:
    """A cap that queues the extra streams passes one level up but serves no more: the incumbent stays."""
    plan = make_plan(stages__refine=REFINE_ONE, repeats={"count": 1})

    def surface(flags: Flags, level: int, seed: int):
        tuned = flags.get("schedule-conservativeness") == 0.7
        thr = 3.2 if tuned and level == 64 else level * 0.1  # held, but at the goodput of 32
        return summary(thr=thr, ttft=900 if level < 64 or (tuned and level == 64) else 1500)

    d, _ = drive(plan, surface)
    assert d.recommendation is not None and d.recommendation.concurrency == 32
    assert d.recommendation.config == {}


def test_a_real_gain_beyond_the_noise_wins() -> None:
    plan = make_plan(stages__refine=REFINE_ONE, repeats={"count": 3})

    def surface(flags: Flags, level: int, seed: int):
        gain = 1.15 if flags.get("schedule-conservativeness") == 0.7 else 1.0
        noise = NOISE[None][seed % 5]
        return summary(thr=level * 0.1 * gain * (1 + noise), mem=0.95 if level >= 64 else 0.5)

    d, _ = drive(plan, surface)
    assert d.recommendation is not None and d.recommendation.config == {"schedule-conservativeness": 0.7}
    assert not d.recommendation.ties
    assert any("schedule-conservativeness 0.7: goodput" in line for line in d.recommendation.explanation)


def test_a_candidate_is_not_rejected_on_one_trial_near_its_bound() -> None:
    """Seen on the H200: max-running-requests 64 served 6% more goodput, and its first trial missed the
    p99 TTFT bound by 2%. One trial near a bound decides nothing: it gets its repeats, and wins when
    most of them pass; one that keeps failing is rejected after them, not before."""
    plan = make_plan(stages__refine=REFINE_ONE, repeats={"count": 3, "max": 5})

    def surface(ttft_of_cand: list[float]):
        def answer(flags: Flags, level: int, seed: int):
            tuned = flags.get("schedule-conservativeness") == 0.7
            ttft = ttft_of_cand[seed % len(ttft_of_cand)] if tuned and level == 32 else 900
            return summary(thr=level * 0.1 * (1.06 if tuned else 1.0), ttft=ttft, mem=0.95 if level >= 64 else 0.5)
        return answer

    d, asked = drive(plan, surface([1020, 900, 950]))  # 1020 > the 1000 ms bound, then passes
    cand = [t for t in asked if t.flags and t.concurrency == 32]
    assert "seed 2 of 3" in cand[1].reason and "marginal" in cand[3].reason
    assert len(cand) == 5  # the verdict flipped: up to repeats.max, passing 3 of 5
    assert d.recommendation is not None and d.recommendation.config == {"schedule-conservativeness": 0.7}
    d, asked = drive(plan, surface([1020, 1100, 980]))  # fails 2 of 3 (marginal): up to repeats.max, then lost
    cand = [t for t in asked if t.flags and t.concurrency == 32]
    assert len(cand) == 5 and d.recommendation is not None and d.recommendation.config == {}


def test_a_marginal_level_gets_more_repeats_and_the_ceiling_says_so() -> None:
    """Level 32's p99 TPOT straddles the 50 ms bound: it passes 2 of 5 repeats, so it fails by majority."""
    plan = make_plan(repeats={"count": 3, "max": 5})
    tpot_at_32 = [48, 53, 49, 55, 52]

    def surface(flags: Flags, level: int, seed: int):
        tpot = 20 if level < 32 else (tpot_at_32[seed % 5] if level == 32 else 90)
        return summary(thr=level * 0.1, tpot=tpot)

    d, asked = drive(plan, surface)
    assert d.ceiling is not None and d.ceiling.level == 16 and d.ceiling.first_fail == 32
    assert d.ceiling.marginal == [32]
    assert any("marginal" in r for r in d.ceiling.reasons)
    assert sum(t.concurrency == 32 for t in asked) == 5  # up to repeats.max
    assert sum(t.concurrency == 16 for t in asked) == 3  # the last pass: its 3 repeats


def test_ramp_stops_on_goodput_not_tokens() -> None:
    """Tokens/s keep rising from 32 to 64, goodput does not: the ceiling is 32 (plateau)."""
    plan = make_plan(repeats={"count": 1})

    def surface(flags: Flags, level: int, seed: int):
        s = summary(thr=level * 0.1)
        if level >= 64:
            s.output_tokens_per_s *= 1.3
            s.goodput_rps = 3.2 * 1.01
        return s

    d, _ = drive(plan, surface)
    assert d.ceiling is not None and (d.ceiling.level, d.ceiling.kind) == (32, "plateau")


def test_an_invalid_trial_is_rerun_bigger_and_never_decides() -> None:
    plan = make_plan(repeats={"count": 1, "invalid_retries": 1})

    tried: list[int] = []

    def surface(flags: Flags, level: int, seed: int):
        s = summary(thr=level * 0.1)
        if level == 32 and not tried:  # the first try at 32 had no steady window
            tried.append(seed)
            s.valid, s.invalid_reasons = False, ["no steady window: the run never left its start-up burst"]
            s.goodput_rps = 100.0  # a transient that looks wonderful
        return s

    d, asked = drive(plan, surface)
    at_32 = [t for t in asked if t.concurrency == 32]
    assert len(at_32) == 2 and "re-run of INVALID trial" in at_32[1].reason
    assert at_32[0].seed_offset == at_32[1].seed_offset == 0  # the same seed, grown: not a new draw
    assert at_32[1].requests > at_32[0].requests and "re-sized" in at_32[1].sizing
    assert d.recommendation is not None and d.recommendation.goodput_rps < 50  # the transient never won

    def never_valid(flags: Flags, level: int, seed: int):
        s = summary(thr=level * 0.1)
        if level >= 64:
            s.valid, s.invalid_reasons = False, ["in flight 40.0 on average: the client did not hold the load"]
        return s

    d, asked = drive(plan, never_valid)
    assert sum(t.concurrency == 64 for t in asked) == 2  # one re-run, then the level counts as failing
    assert d.ceiling is not None and d.ceiling.level == 32 and d.ceiling.kind == "invalid"


def test_trials_are_sized_for_the_window_rules() -> None:
    plan = make_plan(validation={"min_window_s": 20, "min_completions": 200})
    state = CampaignState()
    requests, warmup, how = size_trial(plan, state, {}, 128, "ramp")
    assert requests >= 512 + 2 * 128 - warmup  # 4 per stream at 128 streams, plus the turnover and the tail
    # a measured 10 req/s at level 32 scales to at most 40 req/s at 128: 20 s of it
    state = state.add(TrialOutcome(trial_id="a", stage="ramp", concurrency=32, summary=summary(thr=10.0)))
    requests, _, how = size_trial(plan, state, {}, 128, "ramp")
    assert requests >= 40 * 20 and "from level 32" in how
    capped = make_plan(budget={"max_requests_per_trial": 300})
    assert size_trial(capped, state, {}, 128, "ramp")[0] == 300


def test_the_noise_figures() -> None:
    s = spread([10.0, 10.4, 9.6])
    assert s.n == 3 and abs(s.mean - 10.0) < 1e-12 and abs(s.cv - 0.04) < 1e-12
    assert 0.99 < s.ci95 < 1.0  # t(0.975, 2) x 0.4 / sqrt(3) = 0.9937
    assert spread([5.0]).ci95 is None  # one value has no spread
    assert compare(spread([10.5, 10.9, 10.1]), s, min_change=0.02).outcome == "tie"
    assert compare(spread([12.5, 12.9, 12.1]), s, min_change=0.02).outcome == "better"
    assert compare(spread([10.3]), spread([10.0]), min_change=0.02).outcome == "better"  # n=1: the 2% rule
