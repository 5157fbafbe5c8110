"""Refinement near the ceiling: a coordinate walk over server flags, never the whole grid.

Order (the staged protocol, docs/tuning.md): the radix cache first (on, and a prefix-aware
schedule policy when the workload shares prefixes), then each grid flag in the plan's order
(chunked-prefill-size, then schedule-conservativeness by default), then levels above the
ceiling with the tuned config, then max-running-requests = the level. Along each flag the walk
starts in the direction the SGLang signals suggest and goes on only while goodput improves.

A candidate replaces the incumbent only when its goodput is higher beyond the noise: both get
``repeats`` trials first, and the Welch 95% interval of the difference must exclude the change
(servetune.stats.compare). Within the noise it is a tie, resolved toward the simpler config
(fewer flags set: the engine's defaults) and named as a tie. The walk is replayed from the
measurements on every call, so it is a pure function of the plan and the results.
"""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field

from servetune.plan import FlagValue, Level, TuningPlan
from servetune.stats import Comparison
from servetune.tuning import signals
from servetune.tuning.ceiling import adaptive_gather, bisect_between, climb, first_seeds, ramp_levels, walk_seeds
from servetune.tuning.evidence import Evidence, gather, settle
from servetune.tuning.predict import Predictor
from servetune.tuning.state import CampaignState, Ceiling, Flags, TrialOutcome, TrialSpec

_T = TypeVar("_T")


class RefineResult(BaseModel):
    """Where the walk ended: the best config and level, the trials it compared, and why it moved."""

    model_config = ConfigDict(extra="forbid")

    best: TrialOutcome
    evidence: Evidence | None = None
    compared: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    ties: list[str] = Field(default_factory=list)


def goodput(o: TrialOutcome | Evidence) -> float:
    if isinstance(o, Evidence):
        return o.goodput.mean or 0.0
    return o.summary.goodput_rps or 0.0


def complexity(flags: Flags) -> int:
    """Flags set away from the engine's defaults (a flag set to None or False is not set)."""
    return sum(1 for v in flags.values() if v is not None and v is not False)


def _same(a: FlagValue | None, b: FlagValue | None) -> bool:
    try:
        return float(a) == float(b)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return a == b


class _NeedTrial(Exception):  # noqa: N818 - control flow inside the replay, never escapes this module
    def __init__(self, spec: TrialSpec) -> None:
        self.spec = spec


class _Walk:
    def __init__(self, plan: TuningPlan, state: CampaignState, ceiling: Ceiling, base_flags: Flags) -> None:
        self.plan, self.state, self.ceiling = plan, state, ceiling
        self.compared: list[str] = []
        self.notes: list[str] = []
        self.ties: list[str] = []
        self.predictor = Predictor(plan, state, base_flags) if plan.stages.refine.predict is not None else None
        self.incumbent: Evidence | None = None  # the walk's best so far: where a cut walk ends

    def levels_above(self, level: Level) -> list[Level]:
        """The ramp's levels above ``level``: where a config that ties may show it holds more load."""
        return [x for x in ramp_levels(self.plan) if x > level]

    def need(self, found: TrialSpec | _T) -> _T:
        if isinstance(found, TrialSpec):
            raise _NeedTrial(found)
        return found

    def note(self, *evs: Evidence | None) -> None:
        for ev in evs:
            for tid in [*(ev.trial_ids if ev else []), *(ev.invalid_ids if ev else [])]:
                if tid not in self.compared:
                    self.compared.append(tid)

    def measure(self, flags: Flags, level: Level, reason: str, repeats: int = 1, *, exact: bool = False) -> Evidence:
        """The evidence for ``flags`` at ``level`` with ``repeats`` accepted seeds (at least the walk's, one while
        its verdict is clear of the SLA's edge under adaptive repeats), or exactly ``repeats`` with ``exact``;
        or _NeedTrial."""
        if exact:
            ev = self.need(gather(self.plan, self.state, flags, level, stage="refine", reason=reason, repeats=repeats))
        else:
            ev = self.need(adaptive_gather(self.plan, self.state, flags, level, stage="refine", reason=reason,
                                           repeats=max(repeats, walk_seeds(self.plan))))
        self.note(ev)
        return ev

    def settle(self, cand: Evidence, inc: Evidence, what: str, seeds: int) -> tuple[Evidence, Evidence, Comparison]:
        """Candidate against incumbent at the candidate's level, seed by seed, seeds added while inside the noise."""
        at = self.plan.level_text
        level = cand.level
        c, i, cmp = self.need(settle(
            self.plan, self.state, (cand.flags, level, "refine", f"refine {what} at {at(level)}"),
            (inc.flags, level, _stage(inc), f"incumbent against {what} at {at(level)}"),
            min_change=self.plan.stages.refine.min_improvement, seeds=max(seeds, first_seeds(self.plan))))
        self.note(c, i)
        return c, i, cmp

    def try_switch(self, inc: Evidence, flags: Flags, what: str) -> Evidence:
        """The candidate ``flags`` if it wins beyond the noise (at the incumbent's level, or by holding a higher
        level where the incumbent fails), or ties and is simpler; else the incumbent."""
        self.incumbent = inc
        at = self.plan.level_text
        level = inc.level
        tie_takes_it = complexity(flags) < complexity(inc.flags) or inc.marginal  # simpler, or steadier
        if self.predictor is not None and self.predictor.rules_out(
                flags, inc.representative, level, what, tie_takes_it=tie_takes_it, above=self.levels_above(level)):
            self.notes.append(self.predictor.skipped[-1])  # the calibrated simulator: it cannot change the answer
            return inc
        if self.plan.rate_mode and self.plan.repeats.clear_margin is not None \
                and complexity(flags) >= complexity(inc.flags):
            # adaptive repeats, open loop: every config that passes a rate serves it, so at the capacity a passing
            # candidate that is not simpler can at best tie, and a tie keeps the incumbent; what could make it
            # better is holding the rate above, tried first (one failing seed there ends it) instead of proving
            # the tie on every seed at the capacity
            first = self.measure(flags, level, f"refine {what} at {at(level)}", exact=True)
            self.predicted(flags, inc, first, what)
            if not first.passed:
                return inc
            up = self.carry_up(first, inc, what)
            if up is not None:
                return up
            text = (f"{what}: passes {at(level)} on {first.n} seed(s) but does not hold a rate above it;"
                    " at best a tie at the capacity: kept the incumbent (fewer flags set)")
            self.ties.append(text)
            self.notes.append(text)
            return inc
        cand = self.measure(flags, level, f"refine {what} at {at(level)}")
        self.predicted(flags, inc, cand, what)
        started = cand.n > 1  # once its repeats started they finish (the replay must not stop half-way)
        if not cand.passed and not _near_miss(cand, inc) and not started:
            return inc
        seeds = self.plan.repeat_count if _near_miss(cand, inc) or (started and not cand.passed) else 1
        cand, inc, cmp = self.settle(cand, inc, what, seeds)
        if cmp.outcome == "better" and cand.passed and self.plan.repeat_count > cand.n:
            cand, inc, cmp = self.settle(cand, inc, what, self.plan.repeat_count)  # a winner gets its repeats
        outcome = _outcome(cand, inc, cmp)
        g0, g1 = inc.goodput.text(), cand.goodput.text()
        if outcome == "better":
            self.notes.append(f"{what}: goodput {g0} -> {g1} req/s at {at(level)} ({cmp.text()})")
            return cand
        if outcome == "tie":
            up = self.carry_up(cand, inc, what)
            if up is not None:
                return up
            if cand.n < inc.n and ((inc.marginal and not cand.marginal) or _simpler(cand, inc)):
                # a tie-break stands on the incumbent's seeds, never fewer (one passing seed is not "steadier")
                first = f"{what}: a tie within the noise at {at(level)} on {cand.n} seed(s) ({g1} against {g0} req/s)"
                cand, inc, cmp = self.settle(cand, inc, what, inc.n)
                outcome = _outcome(cand, inc, cmp)
                if outcome != "tie":
                    then = (f"goodput {inc.goodput.text()} -> {cand.goodput.text()} req/s" if outcome == "better"
                            else f"it lost (goodput {cand.goodput.text()} against {inc.goodput.text()} req/s"
                                 + ("" if cand.passed else f"; it failed: {'; '.join(cand.verdict.reasons)}") + ")")
                    self.notes.append(f"{first}; on the incumbent's {inc.n} seeds {then} ({cmp.text()})"
                                      + ("" if outcome == "better" else "; kept the incumbent"))
                    return cand if outcome == "better" else inc
                g0, g1 = inc.goodput.text(), cand.goodput.text()
            steadier = inc.marginal and not cand.marginal
            keep = not (steadier or _simpler(cand, inc))
            why = (" took it: steadier (it passes on every seed; the incumbent's verdict flipped between seeds)"
                   if steadier else " took it: fewer flags set, closer to the engine's defaults")
            text = (f"{what}: a tie within the noise at {at(level)} (goodput {g1} against {g0} req/s; {cmp.text()});"
                    + (" kept the incumbent" if keep else why))
            self.ties.append(text)
            self.notes.append(text)
            return inc if keep else cand
        return inc

    def predicted(self, flags: Flags, inc: Evidence, cand: Evidence, what: str) -> None:
        if self.predictor is not None:
            self.predictor.measured(flags, inc.level, inc.representative, cand.goodput.mean, what)

    def carry_up(self, cand: Evidence, inc: Evidence, what: str, limit: int | None = None) -> Evidence | None:
        """At a fixed level a closed loop's goodput is capped by the load itself, so a config that ties may
        hold more load: it climbs the ramp above the tie like the incumbent did (next ramp levels with the
        plateau rule, then bisection below its first failure), and wins when its best level serves more
        goodput than the incumbent's beyond ``ramp.min_gain`` and the noise, where the incumbent fails or
        serves less. A cap that merely queues more streams holds a level without serving more: no win."""
        plan, at = self.plan, self.plan.level_text
        levels = self.levels_above(cand.level)[:limit]
        gate = self.ceiling.first_fail
        if gate is not None and gate > cand.level and (not levels or gate < levels[0]):
            # first where the incumbent failed, on as many seeds: failing there ends the climb at once
            seeds = len(self.ceiling.fail_trial_ids)
            there = self.measure(cand.flags, gate, f"refine {what}: tied at {at(cand.level)}, tried where the"
                                                   f" incumbent failed ({at(gate)})", repeats=max(1, seeds))
            if not there.passed:
                return None
            levels = [gate, *levels]
        best, last, stop, _ = self.need(climb(plan, self.state, cand.flags, levels, "refine",
                                              f"refine {what}: tied at {at(cand.level)}, carried up", cand))
        if stop is not None and not stop.passed and last is not None and plan.stages.ramp.bisect:
            lo, _hi = self.need(bisect_between(plan, self.state, cand.flags, last, stop, "refine"))
            if lo is not None and lo.passed:
                best = max([b for b in (best, lo) if b is not None], key=goodput)
        self.note(best, last, stop)
        if best is None or best.level <= cand.level:
            return None
        if plan.rate_mode and best.n < plan.repeat_count:  # a capacity holds on every seed, whatever its margin
            best = self.measure(best.flags, best.level, f"refine {what}: its capacity {at(best.level)} on every seed",
                                repeats=plan.repeat_count, exact=True)
            if not best.passed:
                return None
        gain = self.need(settle(plan, self.state,
                                (best.flags, best.level, "refine", f"refine {what} at {at(best.level)}"),
                                (inc.flags, inc.level, _stage(inc), f"incumbent at {at(inc.level)}"),
                                min_change=plan.stages.ramp.min_gain, seeds=max(1, min(best.n, inc.n))))
        best, inc, cmp = gain
        if cmp.outcome != "better":
            return None
        if best.flags == inc.flags:  # the tuned config's own climb: its level moved up
            self.notes.append(f"{what} holds {at(best.level)} (goodput {best.goodput.text()} req/s against"
                              f" {inc.goodput.text()} at {at(inc.level)}: {cmp.text()})")
            return best
        i_up = self.measure(inc.flags, best.level, f"incumbent at {at(best.level)}, against {what}")
        if i_up.n > best.n:  # the incumbent's verdict there stands on more seeds: the candidate's must too
            best = self.measure(best.flags, best.level, f"refine {what} at {at(best.level)}, on the incumbent's"
                                                        " seeds there", repeats=i_up.n)
            if not best.passed:
                return None
        flips = False
        if i_up.passed:
            c, i, same = self.settle(best, i_up, what, max(1, min(best.n, i_up.n)))
            outcome = _outcome(c, i, same)
            # the incumbent holds that level only by majority (its verdict flips between seeds) where the
            # candidate passes on every seed: a tie in goodput there is no reason to stay below it
            flips = outcome == "tie" and i.marginal and not c.marginal
            if outcome != "better" and not flips:
                return None
            best = c
        where = ""
        if not i_up.passed:
            where = f" where the incumbent fails ({'; '.join(i_up.verdict.reasons)})"
        elif flips:
            where = " on every seed, where the incumbent passes only by majority (its verdict flips between seeds)"
        self.notes.append(f"{what}: a tie at {at(cand.level)}, but it holds {at(best.level)} (goodput"
                          f" {best.goodput.text()} req/s against {inc.goodput.text()} at {at(inc.level)}: {cmp.text()})"
                          + where)
        return best


def _stage(ev: Evidence) -> str:
    return ev.outcomes[-1].stage if ev.outcomes else "refine"


def _outcome(cand: Evidence, inc: Evidence, cmp: Comparison) -> str:
    """better | tie | worse: passing beats failing, then goodput beyond the noise and min_improvement."""
    if cand.passed != inc.passed:
        return "better" if cand.passed else "worse"
    if not cand.passed:
        return "worse"
    return cmp.outcome


def _near_miss(cand: Evidence, inc: Evidence) -> bool:
    """A candidate that would win on goodput but failed a latency bound in its one trial: a p99 near its
    bound flips between repeats, so one trial must not reject it (its repeats decide, by majority)."""
    return (cand.n == 1 and inc.passed and not cand.passed and cand.verdict.kind == "sla"
            and goodput(cand) > goodput(inc))


def _simpler(a: Evidence, b: Evidence) -> bool:
    return complexity(a.flags) < complexity(b.flags)


def refine(plan: TuningPlan, state: CampaignState, ceiling: Ceiling, base_flags: Flags,
           cut: str | None = None) -> TrialSpec | RefineResult:
    """The next refinement trial, or the walk's result once every step has its measurement. With ``cut`` (why
    the walk may run no more trials) the walk ends at its incumbent where it would ask for one, and says so."""
    assert ceiling.level is not None
    walk = _Walk(plan, state, ceiling, base_flags)
    try:
        best = _run(plan, walk, ceiling, base_flags)
    except _NeedTrial as need:
        if cut is None or walk.incumbent is None:
            return need.spec
        best = walk.incumbent
        changed = {k: v for k, v in need.spec.flags.items() if not _same(v, best.flags.get(k))}
        walk.notes.append(f"{cut}; not measured: {' '.join(f'--{k} {v}' for k, v in changed.items()) or 'its flags'}"
                          f" at {plan.level_text(need.spec.level)} and the rest of the walk; kept the incumbent")
    if walk.predictor is not None:  # how it was calibrated first, predicted vs measured last
        walk.notes = [walk.predictor.header(), *walk.notes, *walk.predictor.shown]
    rep = best.representative
    assert rep is not None
    return RefineResult(best=rep, evidence=best, compared=walk.compared, notes=walk.notes, ties=walk.ties)


def _run(plan: TuningPlan, walk: _Walk, ceiling: Ceiling, base_flags: Flags) -> Evidence:
    r, knobs = plan.stages.refine, type(plan.engine).tuning  # the engine names its flags, never this walk
    inc = walk.measure(base_flags, ceiling.level, "incumbent at the ceiling")  # type: ignore[arg-type]
    walk.incumbent = inc

    # 1. the prefix cache on, and a prefix-aware policy when prefixes are shared
    off, policy_flag = knobs.prefix_cache_off, knobs.schedule_policy
    if off is not None and r.radix_cache and inc.flags.get(off):
        inc = walk.try_switch(inc, {k: v for k, v in inc.flags.items() if k != off}, "radix cache on")
    if plan.workload.shared_prefix is not None and policy_flag is not None:
        for policy in r.shared_prefix_policies:
            if not _same(inc.flags.get(policy_flag), policy):
                inc = walk.try_switch(inc, {**inc.flags, policy_flag: policy}, f"{policy_flag} {policy}")

    # 2. one flag at a time, in the plan's order
    for flag, values in (r.grid or {}).items():
        inc = _climb(plan, walk, inc, flag, values)

    # 3. a better config may hold a higher level: it climbs like a tied candidate (the incumbent's own
    # ramp stopped at the ceiling; refined flags can move it)
    if r.extend_levels and inc.flags != base_flags:  # the defaults' own ramp already climbed them
        up = walk.carry_up(inc, inc, "the tuned config", limit=r.extend_levels)
        if up is not None:
            inc = up

    # 4. the running-request cap = the level: a water mark that keeps overload in the queue
    if not r.set_max_running or r.max_running_flag is None:
        return inc
    resolved = inc.representative.resolved if inc.representative else {}
    running = inc.flags.get(r.max_running_flag, resolved.get(r.max_running_flag.replace("-", "_")))
    if plan.rate_mode:
        # an open loop has no stream count to cap at, and a cap sized from its mean in-flight level
        # would queue every burst above it: not tried, and said so
        walk.notes.append(f"{r.max_running_flag} not tried: in rate mode the in-flight level varies with the"
                          " arrivals, and a cap at its mean would queue the bursts")
    elif not _same(running, inc.level):
        inc = walk.try_switch(inc, {**inc.flags, r.max_running_flag: inc.level}, f"{r.max_running_flag} {inc.level}")
    return inc


def _climb(plan: TuningPlan, walk: _Walk, inc: Evidence, flag: str, values: list[FlagValue]) -> Evidence:
    """Hill-climb one flag from its current value, signal-suggested direction first."""
    rep = inc.representative
    summary = rep.summary if rep else None
    signal = type(plan.engine).tuning.directions.get(flag)  # which server signal suggests this flag's way
    if signal == "conservativeness" and summary is not None:
        direction = signals.conservativeness_direction(summary)
    elif signal == "chunk" and summary is not None:
        direction = signals.chunk_direction(summary, plan.sla)
    else:
        direction = 1
    resolved = rep.resolved if rep else {}
    current = inc.flags.get(flag, resolved.get(flag.replace("-", "_")))  # unset: the server's own default
    pos = next((i for i, v in enumerate(values) if _same(v, current)), None)
    if pos is None:  # a default outside the list: start in the middle of it
        pos = (len(values) - 1) // 2 if direction < 0 else len(values) // 2
        inc = walk.try_switch(inc, {**inc.flags, flag: values[pos]}, f"{flag} {values[pos]}")
    for d in (direction, -direction):
        moved = False
        p = pos + d
        while 0 <= p < len(values):
            cand = walk.try_switch(inc, {**inc.flags, flag: values[p]}, f"{flag} {values[p]}")
            if cand.flags == inc.flags:  # kept the incumbent (a settled comparison hands back its evidence anew)
                break
            inc, moved, p = cand, True, p + d
        if moved:
            break
    return inc
