"""What to run next: a pure function of the plan and the results so far.

``next_trials(plan, state)`` does no I/O and takes and returns pydantic models, so the CLI
runs it in a loop (servetune.tuning.campaign) and Airflow runs it between tasks with the
state passed as JSON. Calling it again with one more outcome moves the campaign one step on.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from servetune.checklist_report import items_in
from servetune.plan import TuningPlan
from servetune.tuning.ceiling import find_ceiling
from servetune.tuning.costs import no_room_to_refine
from servetune.tuning.evidence import passing
from servetune.tuning.recommend import recommend
from servetune.tuning.refine import RefineResult, refine
from servetune.tuning.robustness import RobustnessResult, checks_so_far, robustness
from servetune.tuning.state import CampaignState, Ceiling, Decision, Flags, Recommendation, TrialOutcome, TrialSpec
from servetune.tuning.warm import confirm, warm_answer


def base_flags(plan: TuningPlan) -> Flags:
    return plan.engine_flags()


def correctness_ok(o: TrialOutcome) -> tuple[bool, str]:
    """Sane output: the trial ran, every request succeeded and produced tokens."""
    s = o.summary
    if o.status == "failed":
        return False, f"correctness trial failed: {o.failure_reason or 'unknown'}"
    if s.requests_failed or s.requests_ok == 0:
        errors = ", ".join(f"{k}={v}" for k, v in s.errors_by_class.items()) or "no successful request"
        return False, f"correctness: {s.requests_failed} of {s.requests_total} requests failed ({errors})"
    if not s.output_len.max:
        return False, "correctness: the server returned no output tokens"
    return True, ""


def next_trials(plan: TuningPlan, state: CampaignState, *, previous: dict[str, Any] | None = None) -> Decision:
    """The next trial(s) to run, or ``done`` with the ceiling and the recommendation."""
    failed = [o for o in state.outcomes if o.status == "failed" and not o.fault]  # a crash is re-run, not a stop
    if failed and plan.on_trial_failure == "stop":
        return _stop(plan, state, previous, f"trial {failed[0].trial_id} failed ({failed[0].failure_reason});"
                                            " the plan says on_trial_failure: stop")
    over_budget = state.gpu_seconds >= plan.budget.max_gpu_minutes * 60
    flags = base_flags(plan)

    if plan.stages.correctness.enabled:
        checks = state.by_stage("correctness")
        if not checks:
            return Decision(stage="correctness", trials=[TrialSpec(  # a warm start's server: the answer's flags
                stage="correctness", concurrency=1, flags=start[0] if (start := warm_answer(plan, previous)) else flags,
                requests=plan.stages.correctness.requests,
                warmup=0, reason="one request must return sane output; record idle GPU memory")])
        ok, why = correctness_ok(checks[-1])
        if not ok:
            return Decision(stage="done", done=True, failed=True, reason=why)

    warm = confirm(plan, state, previous)
    if isinstance(warm, tuple):
        flags, found = warm  # the walk goes on from the previous answer's flags
    else:
        found = warm if isinstance(warm, TrialSpec) else find_ceiling(plan, state, flags)
    if isinstance(found, TrialSpec):
        if over_budget:
            return _stop(plan, state, previous, _budget_reason(plan, state))
        return Decision(stage=found.stage, trials=[found])
    ceiling = found
    if ceiling.level is None:
        return Decision(stage="done", done=True, failed=True, ceiling=ceiling,
                        reason="no concurrency level met the plan's limits: " + "; ".join(ceiling.reasons))

    ramp = next((o for o in state.outcomes if o.trial_id == ceiling.pass_trial_id), None)
    refined: RefineResult | None = None
    if plan.stages.refine.enabled:
        if ramp is not None and not state.by_stage("refine"):
            # the ramp's answer is checked under bursts first, on the server that runs it: a refinement that
            # keeps it (most do) needs no restart back for its check, and one that ends early still has it
            early = robustness(plan, state, ramp, ramp)
            if isinstance(early, TrialSpec) and not over_budget:
                return Decision(stage="robustness", trials=[early], ceiling=ceiling)
        step = refine(plan, state, ceiling, flags)
        if isinstance(step, TrialSpec):
            if over_budget:
                return _stop(plan, state, previous, _budget_reason(plan, state), ceiling=ceiling)
            if (cut := no_room_to_refine(plan, state, step)) is None:
                return Decision(stage="refine", trials=[step], ceiling=ceiling)
            step = refine(plan, state, ceiling, flags, cut=cut)  # the walk so far; the robustness check next
            assert not isinstance(step, TrialSpec)
        refined = step
    chosen = refined.best if refined else ramp
    robust = robustness(plan, state, chosen, ramp) if chosen is not None else None
    if isinstance(robust, TrialSpec):
        if not over_budget:
            return Decision(stage="robustness", trials=[robust], ceiling=ceiling)
        # the answer is chosen: only its margin is incomplete, so it stands, with the checks that ran
        assert chosen is not None
        robust = checks_so_far(plan, state, chosen)
        robust.notes.append(_budget_reason(plan, state, then="the robustness checks are incomplete"))
    if robust is not None and robust.fallback is not None:
        refined = RefineResult(best=robust.fallback, compared=refined.compared if refined else [],
                               notes=refined.notes if refined else [], ties=refined.ties if refined else [])
    notes = [*(robust.notes if robust else []), *([warm] if isinstance(warm, str) else [])]  # why the full walk
    rec = recommend(plan, state, ceiling, refined, previous, notes=notes or None)
    if rec is not None and robust is not None:
        _with_checks(rec, robust)
    return Decision(stage="done", done=True, ceiling=ceiling, recommendation=rec,
                    reason=f"ceiling at {plan.level_text(ceiling.level)}; recommendation at"
                           f" {plan.level_text(rec.rate if plan.rate_mode else rec.concurrency) if rec else '-'}")


RECOMMENDING = "recommending from the trials so far"


def _budget_reason(plan: TuningPlan, state: CampaignState, then: str = RECOMMENDING) -> str:
    return f"GPU budget spent: {state.gpu_seconds / 60:.1f} of {plan.budget.max_gpu_minutes:g} min; {then}"


def _nothing_passed(reason: str, state: CampaignState) -> str:
    """Why a campaign stopped with nothing to recommend, in words that do not promise a recommendation: the
    stop's reason, and when the checklist rejected the measurements, which items it rejected them for (a host
    too busy to sample the GPU on time shows here as gpu_memory_curve on every trial)."""
    reason = reason.removesuffix(f"; {RECOMMENDING}")  # _stop found nothing to recommend after all
    rejected = [o for o in state.outcomes if o.rejected]
    items = Counter(i for o in rejected for i in items_in(o.failure_reason))
    why = (f"; the checklist rejected {len(rejected)} of {len(state.outcomes)} trial(s) ("
           + ", ".join(f"{item} on {n}" for item, n in items.most_common(3)) + ")") if items else ""
    return f"{reason}; no trial passed, so nothing is recommended{why}"


def best_passing(plan: TuningPlan, state: CampaignState) -> TrialOutcome | None:
    """The (config, level) whose pooled evidence passes (by majority; every seed in rate mode) with the most
    mean goodput, as its representative trial: one lucky seed of a config that fails on the others is not it."""
    best = max(passing(plan, state), key=lambda ev: ev.goodput.mean or 0.0, default=None)
    return best.representative if best is not None else None


def unmeasured(plan: TuningPlan, state: CampaignState, answer: TrialOutcome) -> list[str]:
    """What a campaign ended early left unmeasured: the answer's missing seeds, the refinement, the robustness
    checks (a budget answer says what confidence it did not buy)."""
    from servetune.tuning.evidence import current

    left: list[str] = []
    ev = current(plan, state, answer.flags, answer.level)
    if ev.n < plan.repeat_count:
        left.append(f"the answer stands on {ev.n} of {plan.repeat_count} seed(s)")
    grid = plan.stages.refine.grid if plan.stages.refine.enabled else {}
    tried = {k for o in state.by_stage("refine") for k in o.flags if o.flags.get(k) != plan.engine_flags().get(k)}
    if missing := [k for k in grid if k not in tried]:
        left.append("the refinement of " + ", ".join(missing))
    if plan.robustness is not None and not state.by_stage("robustness"):
        left.append(f"the robustness check under gamma {plan.robustness.burstiness:g} bursts")
    return [f"left unmeasured: {'; '.join(left)}"] if left else []


def _stop(plan: TuningPlan, state: CampaignState, previous: dict[str, Any] | None, reason: str,
          ceiling: Ceiling | None = None) -> Decision:
    """End early (budget, stop-on-failure): recommend the best passing trial so far, if any."""
    best = best_passing(plan, state)
    if best is None:
        return Decision(stage="done", done=True, failed=True, reason=_nothing_passed(reason, state), ceiling=ceiling)
    if ceiling is None:
        ceiling = Ceiling(level=best.level, kind="budget", pass_trial_id=best.trial_id,
                          reasons=["the campaign ended before the ramp found the ceiling"])
    robust = checks_so_far(plan, state, best)  # the answer's checks that ran before the stop: its margin stands
    partial = RefineResult(best=best, compared=[o.trial_id for o in state.by_stage("refine")],
                           notes=[reason, *(robust.notes if robust.checks else []), *unmeasured(plan, state, best)])
    rec = recommend(plan, state, ceiling, partial, previous)
    if rec is not None:
        _with_checks(rec, robust)
    return Decision(stage="done", done=True, ceiling=ceiling, recommendation=rec, reason=reason)


def _with_checks(rec: Recommendation, robust: RobustnessResult) -> None:
    """The answer's robustness checks, and their trials among its evidence."""
    rec.robustness = robust.checks
    rec.evidence_trial_ids += [c["trial_id"] for c in robust.checks if c["trial_id"] not in rec.evidence_trial_ids]
