"""Finding the concurrency ceiling from the ramp: the highest level that meets the SLA, keeps GPU
memory under its limit, keeps errors under the threshold and still gains goodput.

Every level's verdict is the pooled verdict of its valid trials (servetune.tuning.evidence). The
two levels that decide the ceiling, the last passing and the first failing (or plateau) one, get
``repeats`` each; a level whose verdict flips between repeats is marginal and gets more, and the
walk is replayed with the pooled verdicts, so a repeat that overturns a verdict moves the ceiling.
The ramp stops on goodput, the figure the plan asks for: a gain within the noise is a plateau.
In rate mode the levels are offered requests/s; the ceiling is the capacity at the SLA, bisected
to within ``RATE_STEP`` of the failing rate (an overloaded open loop fails as ``overload``).
"""

from __future__ import annotations

from servetune.plan import Level, TuningPlan
from servetune.stats import compare
from servetune.tuning.evidence import Evidence, gather
from servetune.tuning.state import CampaignState, Ceiling, Flags, TrialOutcome, TrialSpec
from servetune.tuning.verdict import judge  # re-exported: the one trial verdict (servetune.tuning.verdict)

__all__ = ["find_ceiling", "judge", "ramp_levels", "throughput", "gains"]

RATE_STEP = 0.05  # rate mode: bisect until the gap is this fraction of the failing rate
RATE_HALVINGS = 4  # rate mode, nothing passing: halve the lowest rate this many times before giving up


def throughput(outcome: TrialOutcome) -> float:
    """The figure the ramp climbs on: goodput (requests/s inside the SLA)."""
    return outcome.summary.goodput_rps or 0.0


def gains(now: Evidence, before: Evidence, min_gain: float) -> bool:
    """Does ``now`` gain goodput over ``before`` by more than ``min_gain`` and beyond the noise?"""
    return compare(now.goodput, before.goodput, min_change=min_gain).outcome == "better"


def ramp_levels(plan: TuningPlan) -> list[Level]:
    return [plan.baseline_level, *plan.stages.ramp.levels]


def _gather(plan: TuningPlan, state: CampaignState, flags: Flags, level: Level, stage: str, reason: str,
            repeats: int = 1) -> TrialSpec | Evidence:
    return gather(plan, state, flags, level, stage=stage, reason=reason, repeats=repeats)


def find_ceiling(plan: TuningPlan, state: CampaignState, flags: Flags) -> TrialSpec | Ceiling:
    """Walk baseline + ramp levels (then bisect) for ``flags``: the next trial to run, or the ceiling."""
    ramp = plan.stages.ramp
    last_pass: Evidence | None = None
    stop: Evidence | None = None
    plateau = False
    for i, level in enumerate(ramp_levels(plan)):
        stage = "baseline" if i == 0 else "ramp"
        why = ("baseline at a low rate" if plan.rate_mode else "baseline at low concurrency") if i == 0 \
            else f"ramp: level {level:g}"
        ev = _gather(plan, state, flags, level, stage, why)
        if isinstance(ev, TrialSpec):
            return ev
        if not ev.passed:
            stop = ev
            break
        if last_pass is not None and not gains(ev, last_pass, ramp.min_gain):
            stop, plateau = ev, True
            break
        last_pass = ev
    if stop is None:
        assert last_pass is not None
        need = _decisive(plan, state, flags, [last_pass])
        if need is not None:
            return need
        return Ceiling(level=last_pass.level, kind="exhausted", pass_trial_id=_rep(last_pass),
                       pass_trial_ids=last_pass.trial_ids, marginal=_marginal([last_pass]),
                       reasons=[f"every ramp level up to {last_pass.level} passed; the ceiling may be higher"])
    if plateau:
        assert last_pass is not None
        need = _decisive(plan, state, flags, [last_pass, stop])
        if need is not None:
            return need
        cmp = compare(stop.goodput, last_pass.goodput, min_change=ramp.min_gain)
        return Ceiling(level=last_pass.level, kind="plateau", first_fail=stop.level,
                       pass_trial_id=_rep(last_pass), fail_trial_id=_rep(stop),
                       pass_trial_ids=last_pass.trial_ids, fail_trial_ids=stop.trial_ids,
                       marginal=_marginal([last_pass, stop]),
                       reasons=[f"level {stop.level} goodput {stop.goodput.text()} against {last_pass.goodput.text()}"
                                f" at {last_pass.level}: {cmp.text()}, not a gain of more than {ramp.min_gain:.0%}"
                                " beyond the noise"])
    return _bisect(plan, state, flags, last_pass, stop)


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
        need = _gather(plan, state, flags, ev.level, ev.outcomes[-1].stage,
                       f"ceiling decided at level {ev.level}", repeats=plan.repeat_count)
        if isinstance(need, TrialSpec):
            return need
    return None


def _bisect(plan: TuningPlan, state: CampaignState, flags: Flags, last_pass: Evidence | None,
            first_fail: Evidence) -> TrialSpec | Ceiling:
    """Narrow the gap between the last pass and the first fail; with nothing passing, search down to 1
    stream (a few halvings of the rate in rate mode)."""
    ramp = plan.stages.ramp
    lo, hi = (last_pass.level if last_pass else 0), first_fail.level
    lo_ev, hi_ev = last_pass, first_fail
    step: float = ramp.bisect_min_step if last_pass is not None else 1
    floor = first_fail.level / 2 ** RATE_HALVINGS
    if ramp.bisect or last_pass is None:
        while hi - lo > (RATE_STEP * hi if plan.rate_mode else step):
            if plan.rate_mode:
                if not lo and hi <= floor:
                    break
                mid: Level = round((lo + hi) / 2 if lo else hi / 2, 3)
            else:
                mid = (lo + hi) // 2
            ev = _gather(plan, state, flags, mid, "bisect", f"bisect between {lo or 'nothing'} (pass) and {hi:g} (fail)")
            if isinstance(ev, TrialSpec):
                return ev
            if ev.passed:
                lo, lo_ev = mid, ev
            else:
                hi, hi_ev = mid, ev
    need = _decisive(plan, state, flags, [lo_ev, hi_ev])
    if need is not None:
        return need
    v = hi_ev.verdict
    marginal = _marginal([lo_ev, hi_ev])
    reasons = [f"level {hi}: " + "; ".join(v.reasons)]
    if marginal:
        reasons.append(f"marginal: the SLA verdict flipped between repeats at level(s) {marginal}")
    return Ceiling(
        level=lo_ev.level if lo_ev else None, kind=v.kind if v.kind != "pass" else "sla",  # type: ignore[arg-type]
        first_fail=hi, reasons=reasons, marginal=marginal,
        pass_trial_id=_rep(lo_ev) if lo_ev else None, fail_trial_id=_rep(hi_ev),
        pass_trial_ids=lo_ev.trial_ids if lo_ev else [], fail_trial_ids=hi_ev.trial_ids,
    )
