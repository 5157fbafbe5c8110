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

from pydantic import BaseModel, ConfigDict, Field

from servetune.plan import FlagValue, Level, TuningPlan
from servetune.stats import compare
from servetune.tuning import signals
from servetune.tuning.ceiling import gains, ramp_levels
from servetune.tuning.evidence import Evidence, gather
from servetune.tuning.state import CampaignState, Ceiling, Flags, TrialOutcome, TrialSpec

RADIX_OFF = "disable-radix-cache"


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
    def __init__(self, plan: TuningPlan, state: CampaignState, levels: list[Level] | None = None) -> None:
        self.plan, self.state = plan, state
        self.levels = sorted(set(levels or []))  # where a tied candidate may show it holds more load
        self.compared: list[str] = []
        self.notes: list[str] = []
        self.ties: list[str] = []

    def level_above(self, level: Level) -> Level | None:
        return next((x for x in self.levels if x > level), None)

    def measure(self, flags: Flags, level: Level, reason: str, repeats: int = 1) -> Evidence:
        """The evidence for ``flags`` at ``level`` with ``repeats`` valid trials, or _NeedTrial."""
        ev = gather(self.plan, self.state, flags, level, stage="refine", reason=reason, repeats=repeats)
        if isinstance(ev, TrialSpec):
            raise _NeedTrial(ev)
        for tid in [*ev.trial_ids, *ev.invalid_ids]:
            if tid not in self.compared:
                self.compared.append(tid)
        return ev

    def try_switch(self, inc: Evidence, flags: Flags, what: str) -> Evidence:
        """The candidate ``flags`` at the incumbent's level if it wins beyond the noise (or ties simpler)."""
        at = self.plan.level_text
        level, reason = inc.level, f"refine {what} at {at(inc.level)}"
        cand = self.measure(flags, level, reason)
        outcome = self._compare(cand, inc)
        if outcome == "better" or (outcome == "tie" and _simpler(cand, inc)) or _near_miss(cand, inc) or cand.n > 1:
            # the winner against the config it replaces: repeats on both before deciding (once started,
            # finished: the replay must not stop half-way because the first repeats look tied)
            repeats = self.plan.repeat_count
            cand = self.measure(flags, level, reason, repeats=repeats)
            inc = self.measure(inc.flags, level, f"incumbent against {what} at {at(level)}", repeats=repeats)
            outcome = self._compare(cand, inc)
        g0, g1 = inc.goodput.text(), cand.goodput.text()
        if outcome == "better":
            rel = compare(cand.goodput, inc.goodput, min_change=self.plan.stages.refine.min_improvement)
            self.notes.append(f"{what}: goodput {g0} -> {g1} req/s at {at(level)} ({rel.text()})")
            return cand
        if outcome == "tie" and (up := self.level_above(level)) is not None:
            # at a fixed level a closed loop's goodput is capped by the load itself: a tied config may
            # still hold the next level where the incumbent fails (the ceiling moves, not the rate)
            c_up = self.measure(flags, up, f"refine {what}: tied at {level}, tried at {up}")
            # it must also gain goodput: more streams queued behind a cap hold a level without serving more
            if c_up.passed and gains(c_up, inc, self.plan.stages.ramp.min_gain):
                i_up = self.measure(inc.flags, up, f"incumbent at {up}, against {what}")
                if not i_up.passed:
                    self.notes.append(f"{what}: a tie at {at(level)}, but it holds {at(up)}"
                                      f" (goodput {c_up.goodput.text()} req/s) where the incumbent fails"
                                      f" ({'; '.join(i_up.verdict.reasons)})")
                    return c_up
        if outcome == "tie":
            keep = not _simpler(cand, inc)
            text = (f"{what}: a tie within the noise at {at(level)} (goodput {g1} against {g0} req/s);"
                    + (" kept the incumbent" if keep else " took it: fewer flags set, closer to the engine's defaults"))
            self.ties.append(text)
            self.notes.append(text)
            return inc if keep else cand
        return inc

    def _compare(self, cand: Evidence, inc: Evidence) -> str:
        """better | tie | worse: passing beats failing, then goodput beyond the noise and min_improvement."""
        if cand.passed != inc.passed:
            return "better" if cand.passed else "worse"
        if not cand.passed:
            return "worse"
        return compare(cand.goodput, inc.goodput, min_change=self.plan.stages.refine.min_improvement).outcome


def _near_miss(cand: Evidence, inc: Evidence) -> bool:
    """A candidate that would win on goodput but failed a latency bound in its one trial: a p99 near its
    bound flips between repeats, so one trial must not reject it (its repeats decide, by majority)."""
    return (cand.n == 1 and inc.passed and not cand.passed and cand.verdict.kind == "sla"
            and goodput(cand) > goodput(inc))


def _simpler(a: Evidence, b: Evidence) -> bool:
    return complexity(a.flags) < complexity(b.flags)


def refine(plan: TuningPlan, state: CampaignState, ceiling: Ceiling, base_flags: Flags) -> TrialSpec | RefineResult:
    """The next refinement trial, or the walk's result once every step has its measurement."""
    assert ceiling.level is not None
    walk = _Walk(plan, state, [*ramp_levels(plan), *([ceiling.first_fail] if ceiling.first_fail else [])])
    try:
        best = _run(plan, walk, ceiling, base_flags)
    except _NeedTrial as need:
        return need.spec
    rep = best.representative
    assert rep is not None
    return RefineResult(best=rep, evidence=best, compared=walk.compared, notes=walk.notes, ties=walk.ties)


def _run(plan: TuningPlan, walk: _Walk, ceiling: Ceiling, base_flags: Flags) -> Evidence:
    r = plan.stages.refine
    inc = walk.measure(base_flags, ceiling.level, "incumbent at the ceiling")  # type: ignore[arg-type]

    # 1. radix cache on, and a prefix-aware policy when prefixes are shared
    radix_flags = {k: v for k, v in inc.flags.items() if k != RADIX_OFF}
    if r.radix_cache and inc.flags.get(RADIX_OFF):
        inc = walk.try_switch(inc, radix_flags, "radix cache on")
    if plan.workload.shared_prefix is not None:
        for policy in r.shared_prefix_policies:
            if not _same(inc.flags.get("schedule-policy"), policy):
                inc = walk.try_switch(inc, {**inc.flags, "schedule-policy": policy}, f"schedule-policy {policy}")

    # 2. one flag at a time, in the plan's order
    for flag, values in r.grid.items():
        inc = _climb(plan, walk, inc, flag, values)

    # 3. a better config may hold a higher level
    above = sorted({x for x in [*ramp_levels(plan), ceiling.first_fail or 0] if x > inc.level})
    for level in above[: r.extend_levels]:
        ev = walk.measure(inc.flags, level, f"tuned config one level up: {level}")
        if ev.passed and gains(ev, inc, plan.stages.ramp.min_gain):
            ev = walk.measure(inc.flags, level, f"tuned config holds level {level}", repeats=plan.repeat_count)
            if ev.passed and gains(ev, inc, plan.stages.ramp.min_gain):
                walk.notes.append(f"the tuned config holds {plan.level_text(level)} (goodput {ev.goodput.text()} req/s)")
                inc = ev
                continue
        break

    # 4. max-running-requests = the level: a water mark that keeps overload in the queue
    resolved = inc.representative.resolved if inc.representative else {}
    running = inc.flags.get(r.max_running_flag, resolved.get(r.max_running_flag.replace("-", "_")))
    if r.set_max_running and plan.rate_mode:
        # an open loop has no stream count to cap at, and a cap sized from its mean in-flight level
        # would queue every burst above it: not tried, and said so
        walk.notes.append(f"{r.max_running_flag} not tried: in rate mode the in-flight level varies with the"
                          " arrivals, and a cap at its mean would queue the bursts")
    elif r.set_max_running and not _same(running, inc.level):
        inc = walk.try_switch(inc, {**inc.flags, r.max_running_flag: inc.level}, f"{r.max_running_flag} {inc.level}")
    return inc


def _climb(plan: TuningPlan, walk: _Walk, inc: Evidence, flag: str, values: list[FlagValue]) -> Evidence:
    """Hill-climb one flag from its current value, signal-suggested direction first."""
    rep = inc.representative
    summary = rep.summary if rep else None
    if flag == "schedule-conservativeness" and summary is not None:
        direction = signals.conservativeness_direction(summary)
    elif flag == "chunked-prefill-size" and summary is not None:
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
            if cand is inc:
                break
            inc, moved, p = cand, True, p + d
        if moved:
            break
    return inc
