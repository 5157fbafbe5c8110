"""Refinement near the ceiling: a coordinate walk over server flags, never the whole grid.

Order (seed article 3.3, step 5): the radix cache first (on, and a prefix-aware schedule
policy when the workload shares prefixes), then each grid flag in the plan's order
(chunked-prefill-size, then schedule-conservativeness by default), then levels above the
ceiling with the tuned config, then max-running-requests = the level. Along each flag the walk
starts in the direction the SGLang signals suggest and goes on only while goodput improves.

The walk is replayed from the measurements on every call, so it is a pure function of the
plan and the results: the first configuration it needs and has no measurement for is the
next trial.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from servetune.plan import FlagValue, TuningPlan
from servetune.tuning import signals
from servetune.tuning.ceiling import judge, ramp_levels, throughput
from servetune.tuning.state import CampaignState, Ceiling, Flags, TrialOutcome, TrialSpec

RADIX_OFF = "disable-radix-cache"


class RefineResult(BaseModel):
    """Where the walk ended: the best config and level, the trials it compared, and why it moved."""

    model_config = ConfigDict(extra="forbid")

    best: TrialOutcome
    compared: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


def goodput(o: TrialOutcome) -> float:
    return o.summary.goodput_rps or 0.0


def better(a: TrialOutcome, b: TrialOutcome, plan: TuningPlan, *, prefer_on_tie: bool = False) -> bool:
    """Is ``a`` worth switching to from ``b``? Passing beats failing; then goodput beyond noise;
    within the tie tolerance the healthier signals win (``prefer_on_tie``: ``a`` wins exact ties)."""
    va, vb = judge(a, plan.sla), judge(b, plan.sla)
    if va.passed != vb.passed:
        return va.passed
    if not va.passed:
        return False
    r = plan.stages.refine
    ga, gb = goodput(a), goodput(b)
    if gb <= 0:
        return ga > 0
    rel = ga / gb - 1
    if rel > r.min_improvement:
        return True
    if abs(rel) <= r.tie_tolerance:
        pa, pb = signals.penalty(a.summary), signals.penalty(b.summary)
        return pa < pb or (prefer_on_tie and pa == pb)
    return False


def _same(a: FlagValue | None, b: FlagValue | None) -> bool:
    try:
        return float(a) == float(b)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return a == b


class _NeedTrial(Exception):  # noqa: N818 - control flow inside the replay, never escapes this module
    def __init__(self, spec: TrialSpec) -> None:
        self.spec = spec


class _Walk:
    def __init__(self, plan: TuningPlan, state: CampaignState, level: int) -> None:
        self.plan, self.state, self.level = plan, state, level
        self.requests, self.warmup = plan.refine_requests()
        self.compared: list[str] = []
        self.notes: list[str] = []

    def measure(self, flags: Flags, level: int, reason: str, like: TrialOutcome | None = None) -> TrialOutcome:
        """The measurement of ``flags`` at ``level``; a candidate compared with ``like`` gets its request count."""
        o = self.state.lookup(flags, level)
        if o is None:
            requests, warmup = self.requests, self.warmup
            if like is not None and like.requests:
                requests, warmup = like.requests, like.warmup
            raise _NeedTrial(TrialSpec(stage="refine", concurrency=level, flags=flags, requests=requests,
                                       warmup=warmup, reason=reason))
        if o.trial_id not in self.compared:
            self.compared.append(o.trial_id)
        return o

    def try_switch(self, inc: TrialOutcome, flags: Flags, what: str, *, prefer_on_tie: bool = False) -> TrialOutcome:
        o = self.measure(flags, inc.concurrency, f"refine {what} at concurrency {inc.concurrency}", like=inc)
        if better(o, inc, self.plan, prefer_on_tie=prefer_on_tie):
            g0, g1 = goodput(inc), goodput(o)
            gain = f"{g1 / g0 - 1:+.1%}" if g0 > 0 else "from none"
            self.notes.append(f"{what}: goodput {g0:.2f} -> {g1:.2f} req/s ({gain}) at concurrency"
                              f" {inc.concurrency} (trial {o.trial_id})")
            return o
        return inc


def refine(plan: TuningPlan, state: CampaignState, ceiling: Ceiling, base_flags: Flags) -> TrialSpec | RefineResult:
    """The next refinement trial, or the walk's result once every step has its measurement."""
    assert ceiling.level is not None
    walk = _Walk(plan, state, ceiling.level)
    try:
        best = _run(plan, walk, ceiling, base_flags)
    except _NeedTrial as need:
        return need.spec
    return RefineResult(best=best, compared=walk.compared, notes=walk.notes)


def _run(plan: TuningPlan, walk: _Walk, ceiling: Ceiling, base_flags: Flags) -> TrialOutcome:
    r = plan.stages.refine
    inc = walk.measure(base_flags, ceiling.level, "incumbent at the ceiling")  # type: ignore[arg-type]

    # 1. radix cache on, and a prefix-aware policy when prefixes are shared
    radix_flags = {k: v for k, v in inc.flags.items() if k != RADIX_OFF}
    if r.radix_cache and inc.flags.get(RADIX_OFF):
        inc = walk.try_switch(inc, radix_flags, "radix cache on", prefer_on_tie=True)
    if plan.workload.shared_prefix is not None:
        for policy in r.shared_prefix_policies:
            if not _same(inc.flags.get("schedule-policy"), policy):
                inc = walk.try_switch(inc, {**inc.flags, "schedule-policy": policy}, f"schedule-policy {policy}")

    # 2. one flag at a time, in the plan's order
    for flag, values in r.grid.items():
        inc = _climb(plan, walk, inc, flag, values)

    # 3. a better config may hold a higher level
    above = sorted({x for x in [*ramp_levels(plan), ceiling.first_fail or 0] if x > inc.concurrency})
    for level in above[: r.extend_levels]:
        o = walk.measure(inc.flags, level, f"tuned config one level up: {level}")
        if judge(o, plan.sla).passed and throughput(o) >= throughput(inc) * (1 + plan.stages.ramp.min_gain):
            walk.notes.append(f"the tuned config holds concurrency {level} (goodput {goodput(o):.2f} req/s,"
                              f" trial {o.trial_id})")
            inc = o
        else:
            break

    # 4. max-running-requests = the level: a water mark that keeps overload in the queue
    running = inc.flags.get(r.max_running_flag, inc.resolved.get(r.max_running_flag.replace("-", "_")))
    if r.set_max_running and not _same(running, inc.concurrency):
        inc = walk.try_switch(inc, {**inc.flags, r.max_running_flag: inc.concurrency},
                              f"{r.max_running_flag} {inc.concurrency}", prefer_on_tie=True)
    return inc


def _climb(plan: TuningPlan, walk: _Walk, inc: TrialOutcome, flag: str, values: list[FlagValue]) -> TrialOutcome:
    """Hill-climb one flag from its current value, signal-suggested direction first."""
    if flag == "schedule-conservativeness":
        direction = signals.conservativeness_direction(inc.summary)
    elif flag == "chunked-prefill-size":
        direction = signals.chunk_direction(inc.summary, plan.sla)
    else:
        direction = 1
    current = inc.flags.get(flag, inc.resolved.get(flag.replace("-", "_")))  # unset: the server's own default
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
