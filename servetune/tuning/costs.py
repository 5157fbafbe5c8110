"""What the rest of a campaign costs, in GPU seconds: the ETA's bounds and the budget's reserve.

The campaign's own measurements price its future: a trial at the mean measured trial (start-ups apart), a
server start at the mean measured start-up (the plan's ``budget.restart_cost_s`` until one is measured). The
decisions use the same prices to keep room in a tight budget for the robustness check, so a refinement that
runs out of minutes ends with the answer checked under bursts, not with an unchecked one.
"""

from __future__ import annotations

import math

from servetune.plan import TuningPlan
from servetune.tuning.ceiling import walk_seeds
from servetune.tuning.state import CampaignState, Stage, TrialOutcome, TrialSpec


def remaining_trials_upper_bound(plan: TuningPlan, state: CampaignState, stage: Stage) -> int:
    """At most this many trials are left: the ETA's basis (the walk usually stops sooner)."""
    st = plan.stages
    refine = 0
    if st.refine.enabled:
        refine = 1 + len(st.refine.shared_prefix_policies) + sum(len(v) for v in st.refine.grid.values())
        refine += st.refine.extend_levels + int(st.refine.set_max_running)
    halvings = math.ceil(math.log2(1 / st.ramp.rate_step)) if plan.rate_mode else 4
    bisect = halvings * walk_seeds(plan) if st.ramp.bisect else 0
    measured = {o.level for o in state.outcomes if o.stage in ("baseline", "ramp")}
    ramp_left = sum(1 for c in [plan.baseline_level, *st.ramp.levels] if c not in measured)
    extra = plan.repeat_count - 1  # each decisive measurement and the one it is compared with
    repeats = 2 * extra * (1 + refine)
    robust = 2 * len(plan.robustness.fractions) if plan.robustness else 0  # the chosen config's and the ramp's
    if stage in ("correctness", "baseline", "ramp"):
        return int(stage == "correctness") + ramp_left + bisect + refine + repeats + robust
    if stage == "bisect":
        return bisect + refine + repeats + robust
    if stage == "robustness":
        return max(1, robust - len(state.by_stage("robustness")))
    return max(1, refine + 2 * extra * refine - len(state.by_stage("refine")) + robust)


def restart_cost(plan: TuningPlan, state: CampaignState) -> float:
    """Seconds a server restart costs: the mean of the campaign's measured start-ups after its first (warm-up
    included), the plan's ``budget.restart_cost_s`` until one is measured. The first start on a fresh machine
    pays what later ones do not (kernel compiles, the weights' first read: 176 s against 99 for the VLM on an
    H100), so it prices no restart; the charge on that trial is its own measured start-up either way."""
    measured = [o.startup_seconds for o in state.outcomes if o.restarted and o.startup_seconds > 0]  # kept apart
    later = measured[1:]
    return sum(later) / len(later) if later else float(plan.budget.restart_cost_s)


def mean_trial_s(state: CampaignState) -> float:
    """The mean measured trial so far, its start-up apart (0 before any)."""
    done = [o.gpu_seconds - o.startup_seconds for o in state.outcomes  # a start-up not kept apart: left out
            if o.stage != "correctness" and (not o.restarted or o.startup_seconds > 0)]
    if not done:
        return 0.0
    return sum(done) / len(done)


def trial_cost_s(plan: TuningPlan, state: CampaignState, spec: TrialSpec, *, fresh: bool = False) -> float:
    """Seconds ``spec`` should take: the mean measured trial, plus a restart when its flags differ from the last
    trial's (or the server is ``fresh``: a new runner starts its engine)."""
    last = state.outcomes[-1] if state.outcomes else None
    restart = fresh or last is None or last.flags != spec.flags
    return mean_trial_s(state) + (restart_cost(plan, state) if restart else 0.0)


def restarts_left_upper_bound(plan: TuningPlan, state: CampaignState) -> int:
    """Server starts left at most: one per refinement config not measured yet."""
    st = plan.stages.refine
    if not st.enabled:
        return 0
    configs = len(st.shared_prefix_policies) + sum(len(v) for v in st.grid.values()) + int(st.set_max_running)
    return max(0, configs - len({o.key[0] for o in state.by_stage("refine")}))


def early_checks(state: CampaignState) -> list[TrialOutcome]:
    """The robustness trials run before the refinement's first (the ramp's answer checked first, decisions.py)."""
    first = next((i for i, o in enumerate(state.outcomes) if o.stage == "refine"), len(state.outcomes))
    return [o for o in state.outcomes[:first] if o.stage == "robustness"]


def robustness_reserve_s(plan: TuningPlan, state: CampaignState) -> float:
    """GPU seconds the robustness check of the chosen config costs at most: one trial per fraction, and a server
    start unless the ramp's answer was checked before the refinement (then only a candidate that wins needs a
    check, on its own server, where it was just measured)."""
    if plan.robustness is None:
        return 0.0
    restart = 0.0 if early_checks(state) else restart_cost(plan, state)
    return len(plan.robustness.fractions) * mean_trial_s(state) + restart


def no_room_to_refine(plan: TuningPlan, state: CampaignState, spec: TrialSpec) -> str | None:
    """Why the refinement must stop before ``spec``, or None: under a budget, a refinement trial (with its
    server start when its flags differ from the last trial's) that would leave too little for the robustness
    check is not run; the walk ends with the incumbent, and the check runs on it."""
    reserve = robustness_reserve_s(plan, state)
    if not reserve:
        return None
    early = {o.trial_id for o in early_checks(state)}
    if robust := [o for o in state.by_stage("robustness") if o.trial_id not in early]:  # the final check ran:
        before = CampaignState(outcomes=state.outcomes[:state.outcomes.index(robust[0])])  # the walk's cut was there
        return no_room_to_refine(plan, before, spec) or "the refinement stopped to leave the robustness check its time"
    cost = trial_cost_s(plan, state, spec)
    budget = plan.budget.max_gpu_minutes * 60
    if state.gpu_seconds + cost + reserve <= budget:
        return None
    spent = f"({state.gpu_seconds / 60:.1f} of {plan.budget.max_gpu_minutes:g} min spent)"
    if state.gpu_seconds + cost > budget:
        return (f"the refinement stopped: its next trial (about {cost / 60:.1f} GPU min) would end past the"
                f" budget {spent}")
    whose = "a winning candidate's robustness check" if early else "the robustness check"
    return (f"the refinement stopped: its next trial (about {cost / 60:.1f} GPU min) would leave less than the"
            f" {reserve / 60:.1f} GPU min {whose} needs {spent}")
