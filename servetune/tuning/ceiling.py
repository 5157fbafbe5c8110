"""Finding the concurrency ceiling from the ramp: the highest level that meets the SLA, keeps GPU
memory under its limit, keeps errors under the threshold and still gains goodput.

Every level's verdict is the pooled verdict of its valid trials (servetune.tuning.evidence). The
two levels that decide the ceiling, the last passing and the first failing (or plateau) one, get
``repeats`` each; a level whose verdict flips between repeats is marginal and gets more, and the
walk is replayed with the pooled verdicts, so a repeat that overturns a verdict moves the ceiling.
The ramp stops on goodput, the figure the plan asks for: a gain within the noise is a plateau.
In rate mode the levels are offered requests/s; the ceiling is the capacity at the SLA, bisected
to within ``ramp.rate_step`` (``RATE_STEP``, 2.5%, by default) of the failing rate (an overloaded open loop fails
as ``overload``).
"""

from __future__ import annotations

from servetune.plan import Level, TuningPlan
from servetune.stats import compare, paired_compare
from servetune.tuning.evidence import Evidence, clear, current, gather, settle
from servetune.tuning.state import CampaignState, Ceiling, Flags, TrialOutcome, TrialSpec
from servetune.tuning.verdict import judge  # re-exported: the one trial verdict (servetune.tuning.verdict)

__all__ = ["adaptive_gather", "bisect_between", "climb", "conclude", "find_ceiling", "first_seeds", "make_ceiling",
           "judge", "ramp_levels", "throughput", "gains", "walk_seeds"]

RATE_STEP = 0.025  # rate mode: bisect until the gap is this fraction of the failing rate
RATE_HALVINGS = 4  # rate mode, nothing passing: halve the lowest rate this many times before giving up


PLATEAU_STEPS = 2  # a plateau ends the ramp only when this many levels in a row gain nothing beyond the noise


def throughput(outcome: TrialOutcome) -> float:
    """The figure the ramp climbs on: goodput (requests/s inside the SLA)."""
    return outcome.summary.goodput_rps or 0.0


def gains(now: Evidence, before: Evidence, min_gain: float) -> bool:
    """Does ``now`` gain goodput over ``before`` by more than ``min_gain`` and beyond the noise (seed by seed
    where they share seeds)?"""
    if set(now.by_seed) & set(before.by_seed):
        return paired_compare(now.by_seed, before.by_seed, min_change=min_gain).outcome == "better"
    return compare(now.goodput, before.goodput, min_change=min_gain).outcome == "better"


def ramp_levels(plan: TuningPlan) -> list[Level]:
    return [plan.baseline_level, *plan.stages.ramp.levels]


def walk_seeds(plan: TuningPlan) -> int:
    """Seeds every level of the walk gets: an open loop's capacity must pass on all k of them (bursts differ
    by seed), a closed loop's level gets its repeats where it decides something."""
    return plan.repeat_count if plan.rate_mode else 1


def first_seeds(plan: TuningPlan) -> int:
    """Seeds a comparison starts from: one under adaptive repeats (more are added while it is inside the noise,
    and a level's own verdict gets its seeds when it is near the SLA's edge), else ``walk_seeds``."""
    return 1 if plan.repeats.clear_margin is not None else walk_seeds(plan)


def _gather(plan: TuningPlan, state: CampaignState, flags: Flags, level: Level, stage: str, reason: str,
            repeats: int = 1) -> TrialSpec | Evidence:
    return adaptive_gather(plan, state, flags, level, stage=stage, reason=reason,
                           repeats=max(repeats, walk_seeds(plan)))


def adaptive_gather(plan: TuningPlan, state: CampaignState, flags: Flags, level: Level, *, stage: str, reason: str,
                    repeats: int) -> TrialSpec | Evidence:
    """``gather`` with adaptive repeats (``repeats.clear_margin``): seed 0 first, and the other seeds only when
    its verdict is not clear of the SLA's edge (evidence.clear); without a margin, every seed asked for."""
    if repeats > 1 and plan.repeats.clear_margin is not None:
        first = gather(plan, state, flags, level, stage=stage, reason=reason, repeats=1)
        if isinstance(first, TrialSpec) or (first.n and all(clear(plan, o) for o in first.outcomes)):
            return first
    return gather(plan, state, flags, level, stage=stage, reason=reason, repeats=repeats)


def climb(plan: TuningPlan, state: CampaignState, flags: Flags, levels: list[Level], stage: str, what: str,
          best: Evidence | None = None) -> TrialSpec | tuple[Evidence | None, Evidence | None, Evidence | None, bool]:
    """Walk ``levels`` upwards for ``flags``: the next trial, or (best, last pass, stop, plateau). A level
    that fails stops the walk; one that gains no goodput over the best so far (paired over seeds, a seed
    added while inside the noise) counts towards a plateau, which holds after ``PLATEAU_STEPS`` such levels
    in a row; the best is the passing level with the most goodput, not the last one."""
    ramp = plan.stages.ramp
    last_pass, flat = best, 0
    for level in levels:
        ev = _gather(plan, state, flags, level, stage, f"{what}: level {level:g}")
        if isinstance(ev, TrialSpec):
            return ev
        if not ev.passed:
            return best, last_pass, ev, False
        if best is not None:
            settled = settle(plan, state, (flags, level, stage, f"{what}: level {level:g}"),
                             (best.flags, best.level, best.outcomes[-1].stage, f"{what}: level {best.level:g}"),
                             min_change=ramp.min_gain, seeds=max(first_seeds(plan), min(ev.n, best.n)))
            if isinstance(settled, TrialSpec):
                return settled
            ev, best, cmp = settled
            if not ev.passed:
                return best, last_pass, ev, False
            if cmp.outcome != "better":
                last_pass, flat = ev, flat + 1
                if flat >= PLATEAU_STEPS:
                    return best, last_pass, ev, True
                continue
        best, last_pass, flat = ev, ev, 0
    return best, last_pass, None, False


def find_ceiling(plan: TuningPlan, state: CampaignState, flags: Flags) -> TrialSpec | Ceiling:
    """Walk baseline + ramp levels (then bisect) for ``flags``: the next trial to run, or the ceiling (its
    level: the best accepted level; ``highest_pass``: the highest one that passed)."""
    levels = ramp_levels(plan)
    walked = climb(plan, state, flags, levels[:1], "baseline",
                   "baseline at a low rate" if plan.rate_mode else "baseline at low concurrency")
    if isinstance(walked, TrialSpec):
        return walked
    best, last_pass, stop, plateau = walked
    if stop is None:
        walked = climb(plan, state, flags, levels[1:], "ramp", "ramp", best)
        if isinstance(walked, TrialSpec):
            return walked
        best, last_pass, stop, plateau = walked
    return conclude(plan, state, flags, best, last_pass, stop, plateau)


def conclude(plan: TuningPlan, state: CampaignState, flags: Flags, best: Evidence | None, last_pass: Evidence | None,
             stop: Evidence | None, plateau: bool) -> TrialSpec | Ceiling:
    """The ceiling once a climb has stopped (or run out of levels): the deciding levels' repeats, then the
    bisection below a failure, or the plateau's or the exhausted ladder's answer."""
    ramp = plan.stages.ramp
    if stop is None:
        assert best is not None and last_pass is not None
        need = _decisive(plan, state, flags, [best, last_pass])
        if need is not None:
            return need
        return make_ceiling(plan, state, flags, best, last_pass, None, "exhausted",
                        [f"every ramp level up to {last_pass.level} passed; the ceiling may be higher"])
    if plateau:
        assert best is not None and last_pass is not None
        need = _decisive(plan, state, flags, [best, last_pass, stop])
        if need is not None:
            return need
        best = current(plan, state, flags, best.level)
        cmp = compare(stop.goodput, best.goodput, min_change=ramp.min_gain)
        return make_ceiling(plan, state, flags, best, last_pass, stop, "plateau",
                        [f"levels up to {stop.level} gain no goodput over {best.goodput.text()} at {best.level}"
                         f" ({PLATEAU_STEPS} levels in a row; at {stop.level}: {cmp.text()}), not more than"
                         f" {ramp.min_gain:.0%} beyond the noise"])
    return _bisect(plan, state, flags, best, last_pass, stop)


def make_ceiling(plan: TuningPlan, state: CampaignState, flags: Flags, best: Evidence | None,
                 last_pass: Evidence | None, stop: Evidence | None, kind: str, reasons: list[str]) -> Ceiling:
    """The Ceiling of a finished walk: its best, highest passing and first failing levels with their trials."""
    if best is not None and last_pass is not None and best.level != last_pass.level:
        reasons = [*reasons, f"the best accepted level is {best.level} (goodput {best.goodput.text()}), below the"
                             f" highest passing one, {last_pass.level} ({last_pass.goodput.text()})"]
    marginal = _marginal([best, last_pass, stop])
    if marginal:
        reasons.append(f"marginal: the SLA verdict flipped between seeds at level(s) {marginal}")
    return Ceiling(
        level=best.level if best else None, kind=kind,  # type: ignore[arg-type]
        highest_pass=last_pass.level if last_pass else None,
        first_fail=stop.level if stop else None, reasons=reasons, marginal=marginal,
        pass_trial_id=_rep(best) if best else None, fail_trial_id=_rep(stop) if stop else None,
        pass_trial_ids=best.trial_ids if best else [], fail_trial_ids=stop.trial_ids if stop else [],
    )


def _rep(ev: Evidence) -> str | None:
    rep = ev.representative
    return rep.trial_id if rep else (ev.invalid_ids[-1] if ev.invalid_ids else None)


def _marginal(evs: list[Evidence | None]) -> list[Level]:
    return sorted({e.level for e in evs if e is not None and e.marginal})


def _decisive(plan: TuningPlan, state: CampaignState, flags: Flags, evs: list[Evidence | None]) -> TrialSpec | None:
    """The next repeat a deciding level still needs (invalid levels are not repeated: they were re-run)."""
    for ev in evs:
        if ev is None or not ev.n:
            continue
        if not plan.rate_mode and all(clear(plan, o) for o in ev.outcomes):
            continue  # a closed loop's verdict far from the SLA's edge: another seed could not turn it
        # an open loop's capacity holds on every seed, whatever its margin (bursts differ by seed)
        need = gather(plan, state, flags, ev.level, stage=ev.outcomes[-1].stage,
                      reason=f"ceiling decided at level {ev.level}", repeats=plan.repeat_count)
        if isinstance(need, TrialSpec):
            return need
    return None


def bisect_between(plan: TuningPlan, state: CampaignState, flags: Flags, lo_ev: Evidence | None, hi_ev: Evidence,
                   stage: str) -> TrialSpec | tuple[Evidence | None, Evidence]:
    """Halve the gap between a passing and a failing level of ``flags`` until it is ``bisect_min_step`` wide
    (``ramp.rate_step`` of the failing rate); from nothing passing, down to 1 stream (a few halvings of a rate)."""
    lo, hi = (lo_ev.level if lo_ev else 0), hi_ev.level
    step: float = plan.stages.ramp.bisect_min_step if lo_ev is not None else 1
    floor = hi_ev.level / 2 ** RATE_HALVINGS
    while hi - lo > (plan.stages.ramp.rate_step * hi if plan.rate_mode else step):
        if plan.rate_mode:
            if not lo and hi <= floor:
                break
            mid: Level = round((lo + hi) / 2 if lo else hi / 2, 3)
        else:
            mid = (lo + hi) // 2
        ev = _gather(plan, state, flags, mid, stage, f"bisect between {lo or 'nothing'} (pass) and {hi:g} (fail)")
        if isinstance(ev, TrialSpec):
            return ev
        if ev.passed:
            lo, lo_ev = mid, ev
        else:
            hi, hi_ev = mid, ev
    return lo_ev, hi_ev


def _bisect(plan: TuningPlan, state: CampaignState, flags: Flags, best: Evidence | None, last_pass: Evidence | None,
            first_fail: Evidence) -> TrialSpec | Ceiling:
    """Narrow the gap between the last pass and the first fail; with nothing passing, search down to 1
    stream (a few halvings of the rate in rate mode)."""
    if plan.stages.ramp.bisect or last_pass is None:
        found = bisect_between(plan, state, flags, last_pass, first_fail, "bisect")
        if isinstance(found, TrialSpec):
            return found
        lo_ev, hi_ev = found
    else:
        lo_ev, hi_ev = last_pass, first_fail
    need = _decisive(plan, state, flags, [best, lo_ev, hi_ev])
    if need is not None:
        return need
    if lo_ev is not None:
        lo_ev = current(plan, state, flags, lo_ev.level)
    hi_ev = current(plan, state, flags, hi_ev.level)
    if lo_ev is not None and lo_ev.passed and (best is None or (lo_ev.level > best.level and (plan.rate_mode or gains(
            lo_ev, current(plan, state, flags, best.level), plan.stages.ramp.min_gain)))):
        best = lo_ev  # a bisected level above the best that still gains; an open loop's capacity: the highest pass
    elif best is not None:
        best = current(plan, state, flags, best.level)
    v = hi_ev.verdict
    return make_ceiling(plan, state, flags, best, lo_ev, hi_ev, v.kind if v.kind != "pass" else "sla",
                    [f"level {hi_ev.level:g}: " + "; ".join(v.reasons)])
