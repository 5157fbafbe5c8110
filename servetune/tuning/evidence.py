"""What the campaign knows about one config at one level: its accepted seeds, their verdict and noise.

Decisions never read a single trial. ``Evidence`` pools the accepted trials (VALID and passed by the
checklist) of a (config, level), one per workload seed: the SLA verdict (closed loop: by majority, a tie
fails, "marginal" when the seeds disagree; open loop: a rate passes only when every seed passes), and the
spread of goodput, throughput and each p99. Every config and level is measured on the same seeds (repeat k
is seed offset k: common random numbers) and at the level's one trial size, so two pieces of evidence
compare seed by seed (``settle``). ``gather`` is the one place that asks for more trials: seed k sized to
the level, an INVALID or rejected seed re-run on the same seed (bigger when its window was short), a
crashed one re-run as it was, the seeds a decision needs.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict

from pydantic import BaseModel, ConfigDict, Field

from servetune.plan import Level, TuningPlan
from servetune.result import TrialSummary
from servetune.stats import Comparison, Spread, paired_compare, spread
from servetune.tuning.sizing import RESIZE, size_trial
from servetune.tuning.state import UNPAIRED, CampaignState, Flags, TrialOutcome, TrialSpec, Verdict, config_key
from servetune.tuning.verdict import judge
from servetune.validity import cap_full

#: checklist items about the window's length: a trial they reject is re-run bigger, others at its size
WINDOW_ITEMS = ("steady_window", "window_completions", "one_window", "min_measured", "measured")
#: a p99 whose 95% interval holds its bound is re-measured where this many requests lie above it (1,000)
TAIL_REQUESTS = 10
P99_SETTLED = round(TAIL_REQUESTS / 0.01)
#: an open loop's latency growth whose interval holds its limit is re-measured at this many requests
GROWTH_SETTLED = 2 * P99_SETTLED
#: a settling re-run must grow the trial at least this much (budget.max_requests_per_trial may allow less)
MIN_GROWTH = 1.25


def unsettled(plan: TuningPlan, o: TrialOutcome) -> tuple[int, str] | None:
    """(requests, why) when a bigger trial on the same seed could turn ``o``'s verdict: an SLA verdict resting
    on a p99 whose 95% interval holds its bound, with fewer than ``P99_SETTLED`` requests (a p99 of 250
    requests rests on 2-3 of them, its interval's upper end the maximum; at 1,000 it is the 18th to 4th
    largest); or a kept-up/overloaded verdict whose latency growth's interval holds its limit, with fewer than
    ``GROWTH_SETTLED`` (a quarter of 250 arrivals leaves the ratio of two medians wide, and a backlog shows
    more plainly the longer it grows), where that could turn pass into fail or back (not a trial that fails
    its SLA either way). The biggest size any of them needs; None when settled."""
    s, cap = o.summary, plan.budget.max_requests_per_trial
    kind = judge(o, plan.sla).kind if o.valid and o.requests < cap else None
    needs: list[tuple[int, str]] = []
    if kind in ("pass", "sla") and s.completions_in_window < P99_SETTLED:
        for name in ("ttft", "tpot", "e2e"):
            bound, ci = getattr(plan.sla, f"p99_{name}_ms"), s.p99_interval_ms.get(name)
            if bound is not None and ci and ci[0] <= bound < ci[1]:
                p99 = getattr(s, f"{name}_ms").p99
                needs.append((P99_SETTLED, f"p99 {name.upper()} {p99:.1f} ms with 95% interval {ci[0]:.1f}-{ci[1]:.1f}"
                                           f" around its bound {bound:g}"))
                break
    limit, ci = (s.validity_rules or {}).get("max_latency_growth", 1.5), s.latency_growth_interval
    could_turn = kind == "pass" or (kind == "overload" and not _fails_sla_anyway(plan, s))  # pass <-> fail
    if could_turn and ci and ci[0] <= limit < ci[1] and s.completions_in_window < GROWTH_SETTLED \
            and not cap_full(s.in_flight_mean, s.offered_concurrency):
        needs.append((GROWTH_SETTLED, f"latency growth x{s.latency_growth:.2f} with 95% interval"
                                      f" x{ci[0]:.2f}-x{ci[1]:.2f} around its limit x{limit:g}"))
    if not needs:
        return None
    target, why = max(needs)
    grown = min(cap, math.ceil(o.requests * target / max(s.completions_in_window, 1) * 1.1))
    if grown < o.requests * MIN_GROWTH:
        return None  # the cap leaves too little room: a re-run would settle nothing and make the level's others stale
    return grown, f"{why} at {s.completions_in_window} requests: re-measured at {grown}"


def clear(plan: TuningPlan, o: TrialOutcome) -> bool:
    """Is ``o``'s verdict far from the SLA's edge, so that another seed could not turn it (adaptive repeats,
    ``repeats.clear_margin`` m)? A pass: every bounded p99's 95% interval (the p99 itself without one) at most m x
    its bound, errors at most m x the limit, in an open loop a latency growth whose interval stays under
    1 + m x (limit - 1) with the in-flight cap never full. A failure: memory or errors (not noise), or a p99
    whose whole interval lies beyond its bound / m. Seed-to-seed spreads measured on real SGLang are 5-12% (CV)
    of a p99, so half the bound is many spreads away; an open loop's capacity still gets every seed (bursts
    differ by seed), whatever its margin."""
    m = plan.repeats.clear_margin
    if m is None or not o.valid:
        return False
    s, sla = o.summary, plan.sla
    v = judge(o, sla)
    if v.kind in ("memory", "errors"):
        return True
    if v.kind == "sla":
        for name in ("ttft", "tpot", "e2e"):
            bound, p99 = getattr(sla, f"p99_{name}_ms"), getattr(s, f"{name}_ms").p99
            low = (s.p99_interval_ms.get(name) or (p99, p99))[0]
            if bound is not None and low is not None and low >= bound / m:
                return True
        return False
    if not v.passed or s.error_rate > m * sla.max_error_rate:
        return False
    for name in ("ttft", "tpot", "e2e"):
        bound, p99 = getattr(sla, f"p99_{name}_ms"), getattr(s, f"{name}_ms").p99
        if bound is None:
            continue
        high = (s.p99_interval_ms.get(name) or (p99, p99))[1]
        if high is None or high > m * bound:
            return False
    if plan.rate_mode:
        limit = (s.validity_rules or {}).get("max_latency_growth", 1.5)
        growth = s.latency_growth_interval or ((s.latency_growth,) * 2 if s.latency_growth is not None else None)
        if growth is not None and growth[1] > 1 + m * (limit - 1):
            return False
        if cap_full(s.in_flight_mean, s.offered_concurrency):
            return False
    return True


def _fails_sla_anyway(plan: TuningPlan, s: TrialSummary) -> bool:
    """An overloaded trial whose errors or a p99 (its whole interval) already break the SLA: kept up or not,
    it fails, so its latency growth needs no settling."""
    if s.error_rate > plan.sla.max_error_rate:
        return True
    for name in ("ttft", "tpot", "e2e"):
        bound, p99, ci = getattr(plan.sla, f"p99_{name}_ms"), getattr(s, f"{name}_ms").p99, s.p99_interval_ms.get(name)
        if bound is not None and p99 is not None and p99 > bound and (not ci or ci[0] > bound):
            return True
    return False


class Evidence(BaseModel):
    """The pooled accepted trials of one config at one level, one per seed."""

    model_config = ConfigDict(extra="forbid")

    flags: Flags
    level: Level
    outcomes: list[TrialOutcome] = Field(default_factory=list, description="the accepted ones, one per seed")
    invalid_ids: list[str] = Field(default_factory=list, description="INVALID, rejected or superseded trials")
    verdict: Verdict
    marginal: bool = False
    goodput: Spread = Field(default_factory=lambda: Spread(n=0))
    throughput: Spread = Field(default_factory=lambda: Spread(n=0))
    ttft_p99: Spread = Field(default_factory=lambda: Spread(n=0))
    tpot_p99: Spread = Field(default_factory=lambda: Spread(n=0))
    e2e_p99: Spread = Field(default_factory=lambda: Spread(n=0))

    @property
    def passed(self) -> bool:
        return self.verdict.passed

    @property
    def n(self) -> int:
        return len(self.outcomes)

    @property
    def trial_ids(self) -> list[str]:
        return [o.trial_id for o in self.outcomes]

    @property
    def by_seed(self) -> dict[int, float]:
        """Goodput per workload seed: what a paired comparison reads."""
        return {o.seed_offset: o.summary.goodput_rps or 0.0 for o in self.outcomes}

    @property
    def representative(self) -> TrialOutcome | None:
        """The accepted trial whose goodput is nearest the mean (its signals explain the level)."""
        if not self.outcomes:
            return None
        mean = self.goodput.mean or 0.0
        return min(self.outcomes, key=lambda o: abs((o.summary.goodput_rps or 0.0) - mean))


def pool(plan: TuningPlan, flags: Flags, level: Level, outcomes: list[TrialOutcome],
         superseded: list[str] | None = None) -> Evidence:
    """Evidence from the trials of (flags, level): the accepted ones decide (the latest per seed), the
    others are named."""
    by_seed: dict[int, TrialOutcome] = {}
    for o in outcomes:
        if o.valid:
            by_seed[o.seed_offset] = o
    valid = [by_seed[k] for k in sorted(by_seed)]
    invalid = [*(superseded or []), *(o.trial_id for o in outcomes if o not in valid)]
    if not valid:
        last = outcomes[-1] if outcomes else None
        if last is not None and (last.status == "failed" or last.rejected):
            verdict = judge(last, plan.sla)
            if last.rejected:
                verdict.reasons = [f"no accepted measurement in {len(outcomes)} trial(s): {verdict.reasons[0]}"]
        else:
            why = "; ".join(last.summary.invalid_reasons) if last is not None else "not measured"
            verdict = Verdict(passed=False, kind="invalid",
                              reasons=[f"no valid measurement in {len(outcomes)} trial(s): {why}"])
        return Evidence(flags=flags, level=level, invalid_ids=invalid, verdict=verdict)
    verdicts = [judge(o, plan.sla) for o in valid]
    passes = sum(v.passed for v in verdicts)
    marginal = 0 < passes < len(verdicts)
    # an open loop's capacity must hold on every seed (bursts are the point); a closed loop's level by majority
    need = len(verdicts) if plan.rate_mode else len(verdicts) // 2 + 1
    if passes >= need:
        verdict = Verdict(passed=True, kind="pass",
                          reasons=[f"passed {passes} of {len(verdicts)} seeds"] if marginal else [])
    else:
        failing = [v for v in verdicts if not v.passed]
        kind = Counter(v.kind for v in failing).most_common(1)[0][0]
        reasons = list(dict.fromkeys(r for v in failing for r in v.reasons))
        if len(verdicts) > 1:
            rule = "every seed must pass" if plan.rate_mode else "by majority"
            reasons.insert(0, f"failed {len(failing)} of {len(verdicts)} seeds ({rule})")
        verdict = Verdict(passed=False, kind=kind, reasons=reasons)
    s = [o.summary for o in valid]
    return Evidence(
        flags=flags, level=level, outcomes=valid, invalid_ids=invalid, verdict=verdict,
        marginal=marginal and not plan.rate_mode,
        goodput=spread([x.goodput_rps or 0.0 for x in s]),
        throughput=spread([x.output_tokens_per_s for x in s]),
        ttft_p99=spread([x.ttft_ms.p99 for x in s]),
        tpot_p99=spread([x.tpot_ms.p99 for x in s]),
        e2e_p99=spread([x.e2e_ms.p99 for x in s]),
    )


def size_band(plan: TuningPlan, level: Level) -> Level:
    """The level a trial at ``level`` takes its size from. An open loop: the ladder's rung at or above the rate,
    so a seed is the same requests and the same arrival shape at every rate of a rung's band, only compressed
    in time: its verdict can only worsen with the rate, and a bisection converges (sized per rate, p99s of a
    few hundred requests flip back and forth near the edge). A closed loop: the level itself."""
    if not plan.rate_mode:
        return level
    return min((r for r in (plan.baseline_level, *plan.stages.ramp.levels) if r >= level), default=level)


def level_size(plan: TuningPlan, state: CampaignState, level: Level) -> TrialOutcome | None:
    """The trial that sets ``level``'s size: the biggest run in its band (``size_band``), any config. Every
    trial there is this size, so configs and rates compare at equal sizes; a re-run that grows one makes the
    others' trials stale."""
    band = size_band(plan, level)
    trials = [o for o in state.outcomes if o.stage not in UNPAIRED and size_band(plan, o.level) == band]
    # of the biggest, the latest: a re-run capped at the same request count may take another warm-up, and
    # the trial it replaced must not stay the size (its re-runs would never count: asked for without end)
    return max(reversed(trials), key=lambda o: o.requests, default=None)


#: runs of one seed at one (config, level), beyond its retries, that no decision may pass: re-runs that grow an
#: unsettled verdict up to budget.max_requests_per_trial take a few; more means the rules went round in a circle
MAX_RUNS_PER_SEED = 8


def _sized(o: TrialOutcome, ref: TrialOutcome | None) -> bool:
    return ref is None or (o.requests, o.warmup) == (ref.requests, ref.warmup)


def current(plan: TuningPlan, state: CampaignState, flags: Flags, level: Level) -> Evidence:
    """The evidence as it stands (no trial asked for): the trials of the level's current size."""
    ref = level_size(plan, state, level)
    everything = state.measurements(flags, level)
    now = [o for o in everything if _sized(o, ref)]
    return pool(plan, flags, level, [o for o in now if not o.fault] or now,
                superseded=[o.trial_id for o in everything if not _sized(o, ref)])


def passing(plan: TuningPlan, state: CampaignState) -> list[Evidence]:
    """The pooled evidence of every (config, level) the campaign measured that passes (by majority; every seed
    in rate mode): what an answer may be chosen from."""
    pairs = {o.key: (o.flags, o.level) for o in state.outcomes if o.stage not in UNPAIRED and o.valid}
    return [ev for ev in (current(plan, state, f, lv) for f, lv in pairs.values()) if ev.n and ev.passed]


def gather(plan: TuningPlan, state: CampaignState, flags: Flags, level: Level, *, stage: str, reason: str,
           repeats: int = 1, size: tuple[int, int, str] | None = None) -> TrialSpec | Evidence:
    """The next trial (flags, level) needs, or its evidence once seeds 0..``repeats``-1 are accepted
    (``repeats.max`` when marginal), a seed has used up its attempts, or an open loop failed on a seed;
    ``size`` (requests, warm-up, whence) sets the level's first trial outright (a warm start confirms an answer at
    the size it was found at, or as its goodput says); without it the trial is sized from the campaign."""
    ref = level_size(plan, state, level)
    everything = state.measurements(flags, level)
    now = [o for o in everything if _sized(o, ref)]
    ev = current(plan, state, flags, level)
    wanted = max(repeats, plan.repeats.max if ev.marginal else repeats)  # seeds that disagree: up to max
    for o in ev.outcomes:  # a verdict that could turn with more requests: this seed again, bigger
        if (grow := unsettled(plan, o)) is not None:
            return _spec(plan, stage, flags, level, o.seed_offset, grow[0], o.warmup,
                         f"{reason}: trial {o.trial_id[:8]} unsettled on the same seed", grow[1])
    if plan.rate_mode and ev.n and not ev.passed:
        return ev  # a rate fails once any seed fails: no more seeds needed
    for k in range(wanted):
        tried = [o for o in now if o.seed_offset == k]
        if any(o.valid for o in tried):
            continue
        if sum(o.seed_offset == k for o in everything) > MAX_RUNS_PER_SEED + plan.repeats.invalid_retries \
                + plan.repeats.crash_retries:
            return ev  # a backstop: however the rules above disagree, a seed is never asked for without end
        faults = [o for o in tried if o.fault]
        rest = [o for o in tried if not o.fault]
        if faults and not rest:
            if len(faults) > plan.repeats.crash_retries:
                return pool(plan, flags, level, now) if not ev.n else ev  # the engine keeps dying here: a fault
            return _spec(plan, stage, flags, level, k, faults[-1].requests, faults[-1].warmup,
                         f"{reason}: re-run after an engine crash ({len(faults)} so far)",
                         "as the trial the engine died under")
        if rest and rest[-1].status == "failed":
            return ev  # a server that refused the config or a failed load is a verdict, not noise
        # every undecided attempt on this seed counts, at any size (each re-run grows the level)
        attempts = [o for o in everything
                    if o.seed_offset == k and not o.valid and not o.fault and o.status != "failed"]
        if rest and len(attempts) > plan.repeats.invalid_retries:
            if ev.n:  # this seed cannot be measured validly: the evidence stands on the others, still asked for
                continue
            return ev  # nor could the level's first: nothing there is measurable (an overload's window)
        if rest:
            last = rest[-1]
            grow = not last.rejected or any(item in (last.failure_reason or "") for item in WINDOW_ITEMS)
            if grow:
                requests, warmup, how = size_trial(plan, state, flags, level, stage, resize_from=last)
                if ref is not None and requests <= ref.requests and warmup != ref.warmup:
                    # the cap left no room to grow: the level's size again, so the band's other trials stay current
                    requests, warmup = ref.requests, ref.warmup
                    how = f"{how}; the level's size (trial {ref.trial_id[:8]})"
            else:
                requests, warmup, how = last.requests, last.warmup, "as the rejected trial (not a window item)"
            what = "rejected" if last.rejected else "INVALID"
            return _spec(plan, stage, flags, level, k, requests, warmup,
                         f"{reason}: re-run of {what} trial {last.trial_id[:8]} on the same seed", how)
        if ref is not None:
            requests, warmup, how = ref.requests, ref.warmup, f"the level's size (trial {ref.trial_id[:8]})"
        elif size is not None:
            requests, warmup, how = size
        else:  # the band's first trial: sized for its top rate (the level itself in a closed loop)
            requests, warmup, how = size_trial(plan, state, flags, size_band(plan, level), stage)
        why = reason if k == 0 else f"{reason}: seed {k + 1} of {wanted}" + (
            " (marginal: the verdict flipped)" if ev.marginal else "")
        return _spec(plan, stage, flags, level, k, requests, warmup, why, how)
    return ev


def _spec(plan: TuningPlan, stage: str, flags: Flags, level: Level, seed: int, requests: int, warmup: int,
          reason: str, how: str) -> TrialSpec:
    return TrialSpec(stage=stage, **plan.load_at(level), flags=flags, requests=requests, warmup=warmup,  # type: ignore[arg-type]
                     reason=reason, seed_offset=seed, sizing=how)


def campaign_noise(state: CampaignState) -> tuple[float, int] | None:
    """The noise of a paired difference, measured on the campaign's own repeats: the relative standard
    deviation of goodput differences between two pieces of evidence that share a config or a level, over
    their common seeds, pooled (with its degrees of freedom). None before any two seeds were paired."""
    if "noise" in state._derived:
        return state._derived["noise"]
    groups: dict[tuple[str, Level], dict[int, float]] = defaultdict(dict)
    for o in state.outcomes:
        if o.stage not in ("correctness", "robustness", "protocol") and o.valid:
            groups[o.key][o.seed_offset] = o.summary.goodput_rps or 0.0
    keys = [k for k, g in groups.items() if len(g) >= 2]
    ss, df = 0.0, 0
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            if a[0] != b[0] and a[1] != b[1]:
                continue
            seeds = sorted(set(groups[a]) & set(groups[b]))
            base = sum(groups[b][k] for k in seeds) / len(seeds) if seeds else 0.0
            if len(seeds) < 2 or not base:
                continue
            rel = [(groups[a][k] - groups[b][k]) / base for k in seeds]
            mean = sum(rel) / len(rel)
            ss += sum((r - mean) ** 2 for r in rel)
            df += len(rel) - 1
    state._derived["noise"] = found = ((ss / df) ** 0.5, df) if df else None
    return found


def settle(plan: TuningPlan, state: CampaignState, a: tuple[Flags, Level, str, str], b: tuple[Flags, Level, str, str],
           *, min_change: float, seeds: int = 1) -> TrialSpec | tuple[Evidence, Evidence, Comparison]:
    """Compare a = (flags, level, stage, reason) with b on common seeds at equal sizes, adding a seed to both
    (up to ``repeats.max``) while the answer is inside the noise; the next trial, or both evidences and the
    paired comparison."""
    n = max(1, seeds)
    while True:
        ev_a = gather(plan, state, a[0], a[1], stage=a[2], reason=a[3], repeats=n)
        if isinstance(ev_a, TrialSpec):
            return ev_a
        ev_b = gather(plan, state, b[0], b[1], stage=b[2], reason=b[3], repeats=n)
        if isinstance(ev_b, TrialSpec):
            return ev_b
        cmp = paired_compare(ev_a.by_seed, ev_b.by_seed, min_change=min_change, prior=campaign_noise(state),
                             max_n=plan.repeats.max)
        if not cmp.undecided or n >= plan.repeats.max or min(ev_a.n, ev_b.n) < n:
            return ev_a, ev_b, cmp
        # inside the noise: pair every seed either side already has, then add one to both
        n = min(max(ev_a.n, ev_b.n, n + 1), plan.repeats.max)


__all__ = ["Evidence", "GROWTH_SETTLED", "P99_SETTLED", "RESIZE", "campaign_noise", "config_key", "current", "gather",
           "level_size", "pool", "settle", "size_band", "unsettled"]
