"""Decisions that hold across seeds: every config and level on the same seeds, paired differences with their
interval, a seed added while the answer is inside the noise, a plateau that must hold over more than one
step, a tied candidate carried up the ramp, an INVALID trial re-run on its own seed, and an open loop's
capacity that must pass on every seed.

Each campaign is answered from a hand-made response surface whose seed 0 is an outlier, so the answer one
seed would give is known to be wrong: the decisions are pure (no server, no simulator)."""

from __future__ import annotations

import numpy as np

from servetune.plan import parse_plan
from servetune.result import Percentiles, TrialSummary
from servetune.stats import compare, paired_compare, quantile_interval, spread
from servetune.tuning import CampaignState, TrialOutcome, next_trials
from servetune.tuning.evidence import GROWTH_SETTLED, P99_SETTLED, unsettled
from test_tuning_decisions import make_plan, summary
from test_tuning_noise import drive


def test_a_paired_difference_cancels_the_seeds_draw() -> None:
    """Two configs measured on the same three seeds: the seeds move both by +-10%, the config adds 3%.
    Unpaired, that is noise; paired, the 3% is certain. One seed alone near the threshold is undecided."""
    seed_effect = {0: 0.9, 1: 1.0, 2: 1.1}
    a = {k: 10 * f * 1.03 for k, f in seed_effect.items()}
    b = {k: 10 * f for k, f in seed_effect.items()}
    cmp = paired_compare(a, b, min_change=0.02)
    assert cmp.outcome == "better" and cmp.n == 3 and not cmp.undecided
    assert cmp.noise is not None and cmp.noise < 0.1  # 0.07 req/s on a difference of 0.3
    assert compare(spread(list(a.values())), spread(list(b.values())), min_change=0.02).outcome == "tie"  # unpaired
    one = paired_compare({0: 10.3}, {0: 10.0}, min_change=0.02)  # +3%, the noise unknown: one more seed
    assert one.outcome == "better" and one.undecided and one.noise is None
    assert not paired_compare({0: 10.6}, {0: 10.0}, min_change=0.02).undecided  # 3x the threshold: decided
    # with the campaign's own noise known (1% relative, 20 degrees of freedom) a +3% on one seed is decided
    assert not paired_compare({0: 10.3}, {0: 10.0}, min_change=0.02, prior=(0.002, 20)).undecided


def test_a_seed_0_outlier_does_not_end_the_ramp_on_a_plateau() -> None:
    """Goodput rises 12% from 32 to 64 streams and 25% more at 128 on every seed but seed 0, where 64 is 8%
    low (a 3% gain: under min_gain 5%, a plateau on one seed). Seeds are added while the gain is inside the
    noise, and a plateau must hold over two levels: the ceiling is 128, not 32."""
    plan = make_plan(stages__ramp={"levels": [16, 32, 64, 128, 256], "requests": 200, "bisect": False},
                     repeats={"count": 1})
    curve = {1: 0.1, 8: 1.0, 16: 2.0, 32: 3.2, 64: 3.58, 128: 4.48}

    def surface(flags, level: int, seed: int) -> TrialSummary:
        if level == 256:
            return summary(thr=4.5, ttft=1500)  # over the 1,000 ms bound
        thr = curve[level] * (0.92 if (level, seed) == (64, 0) else 1.0)
        return summary(thr=thr)

    d, asked = drive(plan, surface)
    assert d.ceiling is not None and d.ceiling.level == 128 and d.ceiling.kind == "sla"
    at64 = [t.seed_offset for t in asked if t.concurrency == 64]
    assert at64[0] == 0 and len(set(at64)) >= 2  # a second seed settled the gain seed 0 left inside the noise
    at32 = sorted({t.seed_offset for t in asked if t.concurrency == 32})
    assert at32 == sorted(set(at64))  # the same seeds on both sides of the comparison


def test_a_plateau_is_stated_only_after_two_flat_levels_and_the_answer_is_the_best_level() -> None:
    """32 -> 64 gains nothing beyond min_gain, 64 -> 128 nothing either: a plateau. The answer is the best
    accepted level, the lowest that reached the plateau's goodput (32), not the highest passing one (128)."""
    plan = make_plan(stages__ramp={"levels": [16, 32, 64, 128, 256], "requests": 200, "bisect": False},
                     repeats={"count": 1})
    curve = {1: 0.1, 8: 1.0, 16: 2.0, 32: 3.2, 64: 3.25, 128: 3.22, 256: 3.0}
    d, _ = drive(plan, lambda flags, level, seed: summary(thr=curve[level]))
    assert d.ceiling is not None and d.ceiling.kind == "plateau"
    assert d.ceiling.level == 32 and d.ceiling.highest_pass == 128 and d.ceiling.first_fail == 128
    assert d.recommendation is not None and d.recommendation.concurrency == 32


def test_a_candidate_that_ties_on_seed_0_wins_on_the_seeds_that_follow() -> None:
    """schedule-conservativeness 0.7 serves 10% more on every seed but seed 0 (+1%: a tie on one trial).
    The paired rule adds seeds while the difference is inside the noise and takes the candidate."""
    refine = {"enabled": True, "radix_cache": False, "set_max_running": False, "extend_levels": 0,
              "grid": {"schedule-conservativeness": [0.7]}}
    plan = make_plan(stages__refine=refine, repeats={"count": 1})

    def surface(flags, level: int, seed: int) -> TrialSummary:
        tuned = flags.get("schedule-conservativeness") == 0.7
        gain = (1.01 if seed == 0 else 1.10) if tuned else 1.0
        return summary(thr=level * 0.1 * gain, mem=0.95 if level >= 64 else 0.5)

    d, asked = drive(plan, surface)
    rec = d.recommendation
    assert rec is not None and rec.config == {"schedule-conservativeness": 0.7} and rec.concurrency == 32
    cand = [t for t in asked if t.flags and t.concurrency == 32]
    inc = [t for t in asked if not t.flags and t.concurrency == 32]
    assert len(cand) >= 2 and {t.seed_offset for t in cand} <= {t.seed_offset for t in inc}  # paired seeds
    assert len({t.requests for t in cand + inc}) == 1  # and equal sizes


def test_a_tied_candidate_is_carried_up_the_ramp_past_the_bisection_level() -> None:
    """lpm ties at the ceiling (32) and gains only 2.7% at the bisection's first failing level (40, where the
    defaults fail; under min_gain 5% it was dropped there), but holds 64 with +25%: tried first where the
    incumbent failed, then carried up the ramp like the incumbent (a plateau takes two flat levels), it wins."""
    plan = make_plan(
        stages__ramp={"levels": [16, 32, 64, 128], "requests": 200, "bisect": True, "bisect_min_step": 8},
        stages__refine={"enabled": True, "radix_cache": False, "set_max_running": False, "extend_levels": 0,
                        "grid": {}, "shared_prefix_policies": ["lpm"]},
        workload={"name": "fewshot", "shared_prefix": {"tokens": 512, "share_ratio": 1.0, "num_prefixes": 1}},
        repeats={"count": 1})

    def surface(flags, level: int, seed: int) -> TrialSummary:
        lpm = flags.get("schedule-policy") == "lpm"
        good = {8: 1.0, 16: 2.0, 32: 3.2, 40: 3.2 * 1.027, 48: 3.4, 64: 4.0}
        if lpm:
            return summary(thr=good.get(level, 4.0), ttft=1500 if level > 64 else 500)
        return summary(thr=min(level * 0.1, 3.2), ttft=500 if level <= 32 else 1500)

    d, asked = drive(plan, surface)
    rec = d.recommendation
    assert d.ceiling is not None and d.ceiling.level == 32 and d.ceiling.first_fail == 40
    assert rec is not None and rec.config == {"schedule-policy": "lpm"} and rec.concurrency == 64
    carried = [t.concurrency for t in asked if t.flags and t.concurrency != 32]
    assert carried[0] == 40 and 64 in carried  # where the defaults failed, then on up: 2.7% there does not stop it
    assert [t.concurrency for t in asked if t.flags].index(64) > [t.concurrency for t in asked if t.flags].index(40)
    assert any("holds concurrency 64" in line and "where the incumbent fails" in line for line in rec.explanation)


def test_a_tie_break_stands_on_the_incumbents_seeds() -> None:
    """The incumbent passes concurrency 32 on 4 of 5 seeds (its verdict flipped on seed 2); a candidate ties
    on seed 0, where it passes. One passing seed must not make it "steadier": it is measured on the
    incumbent's seeds, fails three of them, and the incumbent stays."""
    plan = make_plan(stages__ramp={"levels": [16, 32, 64], "requests": 200, "bisect": False},
                     stages__refine={"enabled": True, "radix_cache": False, "set_max_running": False,
                                     "extend_levels": 0, "grid": {"schedule-conservativeness": [0.7]}},
                     repeats={"count": 3, "max": 5})

    def surface(flags, level: int, seed: int) -> TrialSummary:
        tuned = flags.get("schedule-conservativeness") == 0.7
        over = level > 32 or (level == 32 and (seed in (1, 2, 3) if tuned else seed == 2))
        return summary(thr=level * 0.1, ttft=1500 if over else 500)

    d, asked = drive(plan, surface)
    rec = d.recommendation
    assert d.ceiling is not None and d.ceiling.level == 32 and 32 in d.ceiling.marginal
    assert rec is not None and rec.config == {} and rec.concurrency == 32
    inc = {t.seed_offset for t in asked if not t.flags and t.concurrency == 32}
    cand = {t.seed_offset for t in asked if t.flags and t.concurrency == 32}
    assert len(inc) == 5 and cand >= inc  # the tie-break ran on every seed the incumbent stands on
    assert not any("steadier" in line for line in rec.explanation)


def _rate_plan(**over):
    data = {
        "name": "cap", "model": "m", "load": {"mode": "rate", "arrival": "gamma", "burstiness": 0.5},
        "sla": {"p99_ttft_ms": 1000, "p99_tpot_ms": 50, "max_error_rate": 0.01},
        "stages": {"correctness": {"enabled": False}, "baseline": {"rate": 1, "requests": 200},
                   "ramp": {"levels": [2, 4, 8, 16], "requests": 200, "bisect": True}, "refine": {"enabled": False}},
        "repeats": {"count": 3}, **over,
    }
    return parse_plan(data)


def _open_loop(rate: float, *, ttft: float, valid: bool = True) -> TrialSummary:
    return TrialSummary(
        requests_total=400, requests_measured=400, requests_ok=400, error_rate=0.0, window_s=60.0,
        ttft_ms=Percentiles(count=400, p99=ttft), tpot_ms=Percentiles(count=400, p99=20.0),
        e2e_ms=Percentiles(count=400, p99=ttft + 2000, mean=1500.0), output_len=Percentiles(count=400, max=128),
        request_throughput=rate, goodput_rps=rate, output_tokens_per_s=rate * 100, valid=valid,
        invalid_reasons=[] if valid else ["steady window 8.0 s < 20 s"], sustained=True)


def _drive_rate(plan, surface, max_steps: int = 300):
    """Run a rate-mode campaign on ``surface(spec, state) -> TrialSummary``: (final decision, state)."""
    state = CampaignState()
    for i in range(max_steps):
        d = next_trials(plan, state)
        if d.done:
            return d, state
        (spec,) = d.trials
        state = state.add(TrialOutcome(trial_id=f"t{i}", stage=spec.stage, concurrency=spec.concurrency, rate=spec.rate,
                                       requests=spec.requests, warmup=spec.warmup, seed_offset=spec.seed_offset,
                                       summary=surface(spec, state), gpu_seconds=60))
    raise AssertionError("campaign did not finish")


def test_capacity_holds_on_every_seed_and_an_invalid_seed_is_re_run_on_itself() -> None:
    """Under bursts seed 0 breaks the TTFT bound from 6 req/s on, seeds 1 and 2 only from 12. Seed 0's first
    trial at 8 req/s is INVALID (a short window): re-run on seed 0, bigger, it fails. Redrawing the seed
    would have passed it. The capacity is the highest rate that passes on all three seeds (5 req/s)."""
    plan = _rate_plan()

    def surface(spec, state):
        rate = spec.rate
        assert rate is not None
        tried = [o for o in state.outcomes if o.rate == rate and o.seed_offset == spec.seed_offset]
        edge = 6 if spec.seed_offset == 0 else 12
        return _open_loop(rate, ttft=1500 if rate >= edge else 400, valid=not (rate == 8 and spec.seed_offset == 0
                                                                               and not tried))

    d, state = _drive_rate(plan, surface, max_steps=200)
    assert d.done and d.recommendation is not None
    assert 5 <= d.recommendation.rate < 6 and d.ceiling is not None and d.ceiling.level == d.recommendation.rate
    rerun = [o for o in state.outcomes if o.rate == 8 and o.seed_offset == 0]
    assert len(rerun) == 2 and rerun[1].requests > rerun[0].requests  # the same seed, grown
    # one size per ladder rung's band: every rate bisected between 4 and 8 runs at the 8 rung's (grown) size,
    # so a seed is the same traffic at each of them, compressed
    band = [o for o in state.outcomes if 4 < o.rate <= 8 and o is not rerun[0]]
    assert len({o.rate for o in band}) >= 3
    assert {(o.requests, o.warmup) for o in band} == {(rerun[1].requests, rerun[1].warmup)}
    passing = {o.rate for o in state.outcomes if o.rate == d.recommendation.rate}
    assert passing and {o.seed_offset for o in state.outcomes if o.rate == d.recommendation.rate} == {0, 1, 2}


def test_a_p99_verdict_inside_its_interval_is_re_measured_on_its_seed_at_the_settled_size() -> None:
    """Seed 2's p99 TPOT sits in a wide interval around the 50 ms bound at 6 req/s: at 250 requests it passes
    by 2-3 requests (its interval's top is the maximum). Its trial is re-run on seed 2 at the size where the
    p99 rests on 10 requests, and that verdict (a fail) decides; the band's other trials follow to its size."""
    plan = _rate_plan()

    def surface(spec, state):
        rate = spec.rate
        s = _open_loop(rate, ttft=400 if rate < 12 else 1500)
        s.completions_in_window = round(spec.requests * 0.95)
        big = s.completions_in_window >= P99_SETTLED
        if spec.seed_offset == 2 and 5 <= rate < 12:  # near the bound: the interval holds it until settled
            s.tpot_ms = Percentiles(count=s.completions_in_window, p99=55.0 if big else 48.0)
            s.p99_interval_ms = {"tpot": [53.0, 58.0] if big else [44.0, 70.0]}
        else:
            s.p99_interval_ms = {"tpot": [15.0, 30.0]}
        return s

    d, state = _drive_rate(plan, surface)
    assert d.done and d.recommendation is not None
    assert 4 <= d.recommendation.rate < 5  # not 8 or above, which the 250-request verdicts would have passed
    grown = [o for o in state.outcomes if o.seed_offset == 2 and o.summary.completions_in_window >= P99_SETTLED]
    first = next(o for o in state.outcomes if o.seed_offset == 2 and 5 <= o.rate < 12)
    assert grown and grown[0].rate == first.rate and first.summary.completions_in_window < P99_SETTLED
    assert all(unsettled(plan, o) is None for o in state.outcomes if o.summary.completions_in_window >= P99_SETTLED)
    assert not any(o.requests >= grown[0].requests for o in state.outcomes if o.rate < 4)  # clear ones stay small


def test_an_overload_verdict_inside_its_growth_interval_is_re_measured_on_its_seed_at_the_settled_size() -> None:
    """From 8 req/s seed 1's latency growth reads x1.55 at a few hundred requests, its interval x1.2-x1.95
    holding the x1.5 limit: an overload verdict a noise flip could make. Re-measured on seed 1 at 2,000
    requests it reads x1.1 (x1.0-x1.2): kept up. The capacity is where the TTFT bound breaks on every seed
    (12 req/s), not below 8."""
    plan = _rate_plan()

    def surface(spec, state):
        rate = spec.rate
        s = _open_loop(rate, ttft=400 if rate < 12 else 1500)
        s.completions_in_window = round(spec.requests * 0.95)
        s.in_flight_mean, s.offered_concurrency = 10.0, 512
        big = s.completions_in_window >= GROWTH_SETTLED
        if spec.seed_offset == 1 and rate >= 8 and not big:
            s.latency_growth, s.latency_growth_interval, s.sustained = 1.55, [1.2, 1.95], False
        else:
            s.latency_growth, s.latency_growth_interval = 1.1 if rate >= 8 else 1.0, [1.0, 1.2]
        return s

    d, state = _drive_rate(plan, surface)
    assert d.done and d.recommendation is not None
    assert 11 <= d.recommendation.rate < 12, d.recommendation.rate
    first = next(o for o in state.outcomes if o.seed_offset == 1 and o.rate == 8)
    assert first.summary.sustained is False and unsettled(plan, first) is not None
    grown = [o for o in state.outcomes if o.seed_offset == 1 and o.rate == 8 and o is not first]
    assert grown and grown[-1].summary.completions_in_window >= GROWTH_SETTLED and grown[-1].summary.sustained
    assert all(unsettled(plan, o) is None for o in state.outcomes if o.summary.completions_in_window >= GROWTH_SETTLED)
    assert not any(o.requests >= grown[-1].requests for o in state.outcomes if o.rate < 4)  # clear ones stay small


def test_a_p99_interval_covers_the_true_p99_and_tightens_with_the_count() -> None:
    rng = np.random.default_rng(7)
    true_p99 = -np.log(0.01)  # Exp(1)
    # at 250 the top can be no higher than the maximum, which misses the p99 in 0.99^250 = 8% of draws
    for n, top, coverage in ((250, 1, 0.86), (1000, 4, 0.92)):
        covered, widths = 0, []
        for _ in range(400):
            x = rng.exponential(1.0, n)
            lo, hi = quantile_interval(x)
            covered += lo <= true_p99 <= hi
            widths.append(hi - lo)
            assert hi >= np.sort(x)[-top]  # at 250 the top is the maximum; at 1,000 among the 4 largest
        assert covered / 400 >= coverage, (n, covered)
        if n == 250:
            wide = np.median(widths)
    assert np.median(widths) < 0.75 * wide  # 1.50 against 2.27 (Exp(1), median of 400 draws)


def test_a_tied_candidate_that_holds_a_level_on_every_seed_beats_an_incumbent_that_holds_it_by_majority() -> None:
    """The defaults hold 128 streams only by majority (seeds 0 and 2 fail p99 TTFT, with little goodput), so the
    ceiling is 64, their best accepted level. A chunk size ties at 64, then holds 128 on every seed with 30%
    more goodput than 64; at 128 its goodput against the defaults' is a tie (the defaults' two failing seeds make
    the difference noisy), which used to drop it. Passing where the incumbent's verdict flips wins."""
    plan = make_plan(
        stages__ramp={"levels": [16, 32, 64, 128], "requests": 200, "bisect": False},
        stages__refine={"enabled": True, "radix_cache": False, "set_max_running": False, "extend_levels": 0,
                        "grid": {"chunked-prefill-size": [4096]}},
        repeats={"count": 3, "max": 5})
    noise = [0.0, 0.015, -0.01, 0.02, -0.015]

    def surface(flags, level: int, seed: int) -> TrialSummary:
        tuned = flags.get("chunked-prefill-size") == 4096
        if level == 128 and not tuned and seed in (0, 2):
            return summary(thr=3.0, ttft=1500)
        thr = (8.4 if level == 128 else level * 0.1) * (1 + noise[seed] * (1.3 if tuned else 1.0))
        return summary(thr=thr)

    d, _asked = drive(plan, surface)
    rec = d.recommendation
    assert d.ceiling is not None and d.ceiling.level == 64 and 128 in d.ceiling.marginal
    assert rec is not None and rec.config == {"chunked-prefill-size": 4096} and rec.concurrency == 128
    assert any("a tie at concurrency 64, but it holds concurrency 128" in line for line in rec.explanation)
