"""The recommendation: the chosen config with its evidence, its figures, why, and what changed."""

from __future__ import annotations

import math
from typing import Any

from servetune.plan import TuningPlan
from servetune.tuning import signals
from servetune.tuning.deployed import against_deployed, describe as describe_deployed, flag_changes
from servetune.tuning.evidence import Evidence, current as current_evidence, level_size
from servetune.tuning.objective import by_objective
from servetune.tuning.refine import RefineResult, goodput
from servetune.tuning.regressions import regressions
from servetune.tuning.state import CampaignState, Ceiling, Recommendation, TrialOutcome, TrialSize


def _unmeasurable(plan: TuningPlan, state: CampaignState, chosen: TrialOutcome, ev: Evidence) -> str | None:
    """The answer's seeds that no trial measured validly (each INVALID or rejected up to its retries): the answer
    stands on fewer seeds than the plan asks for, and says which and why."""
    tried = [o for o in state.measurements(chosen.flags, chosen.level) if not o.fault and o.status != "failed"]
    lost = sorted({o.seed_offset for o in tried} - {o.seed_offset for o in tried if o.valid})
    if not lost:
        return None
    bad = [o for o in tried if o.seed_offset in lost]
    why = bad[-1].failure_reason or "; ".join(bad[-1].summary.invalid_reasons or []) or "no valid window"
    return (f"the answer stands on {ev.n} of {plan.repeat_count} seed(s): seed(s) {', '.join(str(k + 1) for k in lost)}"
            f" could not be measured validly ({len(bad)} trial(s) INVALID or rejected; the last: {why[:240]})")


def recommend(
    plan: TuningPlan, state: CampaignState, ceiling: Ceiling, refined: RefineResult | None,
    previous: dict[str, Any] | None = None, notes: list[str] | None = None,
) -> Recommendation | None:
    """Build the recommendation from the refined best (or the ceiling level); None when nothing passed.

    Its figures are the means over the chosen config's valid repeats, with the goodput's 95%
    interval, so a reader sees how noisy the answer is."""
    chosen: TrialOutcome | None = refined.best if refined else None
    if chosen is None and ceiling.pass_trial_id is not None:
        chosen = next(o for o in state.outcomes if o.trial_id == ceiling.pass_trial_id)
    if chosen is None:
        return None
    chosen, objective_notes = by_objective(plan, state, chosen)
    ev = refined.evidence if refined and refined.evidence else None
    if ev is None or ev.flags != chosen.flags or ev.level != chosen.level:
        ev = current_evidence(plan, state, chosen.flags, chosen.level)
    s = chosen.summary
    sized = level_size(plan, state, chosen.level) or chosen  # every trial of the level's evidence is this size
    evidence = [chosen.trial_id, *(t for t in ev.trial_ids if t != chosen.trial_id)]
    for tid in [*(o.trial_id for o in state.by_stage("baseline")), ceiling.pass_trial_id, ceiling.fail_trial_id,
                *ceiling.pass_trial_ids, *ceiling.fail_trial_ids, *(refined.compared if refined else [])]:
        if tid and tid not in evidence:
            evidence.append(tid)
    what = "capacity" if plan.rate_mode else "ceiling"
    explanation = [f"{what} at {plan.level_text(ceiling.level)} ({ceiling.kind}): " + "; ".join(ceiling.reasons)]
    concurrency = chosen.concurrency
    if plan.rate_mode and chosen.rate is not None:
        concurrency = implied_concurrency(chosen)
        assert plan.load is not None
        offered = [o.summary.scheduled_rate for o in ev.outcomes if o.summary.scheduled_rate]
        stated = (f"; the schedules offered {sum(offered) / len(offered):.3g} req/s over their measured arrivals"
                  f" (mean of {len(offered)} seed(s))") if offered else ""
        explanation.insert(0, f"capacity {chosen.rate:g} req/s at the SLA under {plan.load.arrivals_text()}, passing"
                              f" on every one of {max(ev.n, 1)} seed(s){stated}; about {concurrency} requests in"
                              f" flight (Little's law: {chosen.rate:g} req/s x mean E2E {s.e2e_ms.mean or 0:.0f} ms)")
    if lost := _unmeasurable(plan, state, chosen, ev):
        explanation.insert(1, lost)
    if refined:
        explanation.extend(refined.notes or ["no refinement step beat the ramp's config by more than"
                                             f" {plan.stages.refine.min_improvement:.0%} and beyond the noise"])
    if ev.n > 1:
        explanation.append(f"goodput {ev.goodput.text()} req/s over {ev.n} repeats with different workload seeds")
    if faults := [o for o in state.outcomes if o.fault]:
        levels = sorted({o.level for o in faults})
        explanation.append(f"the engine died under {len(faults)} trial(s) (levels {levels}); each was re-run on a"
                           " restarted engine and none counted as a capacity verdict")
    explanation.extend(objective_notes)
    explanation.extend(signals.describe(s, concurrency))
    if s.prefix_hit_rate is not None:
        explanation.append(f"prefix hit rate {s.prefix_hit_rate:.1%} (cached/prompt tokens from usage)")
    explanation.extend(notes or [])
    explanation.append(bought(plan, state))
    rec = Recommendation(
        config=dict(chosen.flags),
        concurrency=concurrency,
        rate=chosen.rate,
        evidence_trial_ids=evidence,
        goodput_rps=ev.goodput.mean if ev.n else s.goodput_rps,
        p99_ttft_ms=ev.ttft_p99.mean if ev.n else s.ttft_ms.p99,
        p99_tpot_ms=ev.tpot_p99.mean if ev.n else s.tpot_ms.p99,
        p99_e2e_ms=ev.e2e_p99.mean if ev.n else s.e2e_ms.p99,
        output_tokens_per_s=ev.throughput.mean if ev.n else s.output_tokens_per_s,
        prefix_hit_rate=s.prefix_hit_rate,
        explanation=explanation,
        repeats=max(ev.n, 1),
        goodput_ci95=ev.goodput.ci95,
        goodput_cv=ev.goodput.cv,
        ties=list(refined.ties) if refined else [],
        objective=plan.objective,
        **_energy_and_cost(ev.outcomes if ev.n else [chosen]),
        trial_size=TrialSize(requests=sized.requests, warmup=sized.warmup),
    )
    rec.vs_deployed = against_deployed(plan, state, chosen.flags, chosen.level, rec.goodput_rps)
    if line := describe_deployed(plan, rec.vs_deployed):
        rec.explanation.insert(len(rec.explanation) - 1, line)  # before what the answer cost
    if previous is not None:
        rec.diff_from_previous = diff_recommendations(previous, rec)
    return rec


def bought(plan: TuningPlan, state: CampaignState) -> str:
    """What the answer cost and what confidence that bought: GPU minutes (start-ups apart), trials, and under
    adaptive repeats the (config, level) pairs settled on one seed because they were far from the SLA's edge."""
    from servetune.tuning.evidence import clear

    startup = state.startup_seconds
    text = (f"bought with {state.gpu_seconds / 60:.1f} GPU min over {len(state.outcomes)} trial(s) and"
            f" {state.server_starts} server start(s)"
            + (f" ({startup / 60:.1f} min of start-ups and their warm-ups)" if startup else ""))
    if plan.repeats.clear_margin is None:
        return text
    seeds: dict[tuple[str, float], list[TrialOutcome]] = {}
    for o in state.outcomes:
        if o.valid and o.stage not in ("correctness", "robustness", "protocol"):
            seeds.setdefault(o.key, []).append(o)
    one = [plan.level_text(level) for level in sorted({v[0].level for v in seeds.values()
                                                       if len({o.seed_offset for o in v}) == 1 and clear(plan, v[0])})]
    if one:
        text += (f"; {len(one)} measurement(s) settled on one seed, their verdicts beyond"
                 f" {plan.repeats.clear_margin:.0%} of the SLA's bounds: {', '.join(one)}")
    return text


def _energy_and_cost(outcomes: list[TrialOutcome]) -> dict[str, float | None]:
    """Means over the chosen config's repeats (None where a trial lacks the figure: no power, no price)."""
    out: dict[str, float | None] = {}
    for name in ("energy_per_output_token_j", "gpu_power_window_mean_w", "cost_per_mtok_usd", "cost_per_1k_good_usd"):
        values = [getattr(o.summary, name) for o in outcomes]
        out[name] = sum(values) / len(values) if values and all(v is not None for v in values) else None
    return out


def implied_concurrency(chosen: TrialOutcome) -> int:
    """The in-flight level an open loop at its rate holds: rate x mean E2E (Little's law), rounded up."""
    e2e_s = (chosen.summary.e2e_ms.mean or 0.0) / 1000.0
    return max(1, math.ceil((chosen.rate or 0.0) * e2e_s))


def diff_recommendations(previous: dict[str, Any], current: Recommendation) -> dict[str, Any]:
    """Flags added/removed/changed, the concurrency and the figures, old -> new, and the figures that fell
    behind beyond their noise (servetune.tuning.regressions)."""
    old_cfg: dict[str, Any] = previous.get("config") or {}
    new_cfg = current.config
    changed = flag_changes(old_cfg, new_cfg)
    figures: dict[str, Any] = {}
    for name in ("concurrency", "rate", "goodput_rps", "p99_ttft_ms", "p99_tpot_ms", "p99_e2e_ms",
                 "output_tokens_per_s", "prefix_hit_rate", "energy_per_output_token_j", "cost_per_mtok_usd"):
        old, new = previous.get(name), getattr(current, name)
        entry: dict[str, Any] = {"old": old, "new": new}
        if isinstance(old, int | float) and isinstance(new, int | float) and old:
            entry["change"] = new / old - 1
        figures[name] = entry
    out: dict[str, Any] = {"config": changed, "figures": figures, "same_config": not changed,
                           "regressions": regressions(previous, current.model_dump(mode="json"))}
    if previous.get("experiment_id"):  # from the warehouse (servetune.warehouse.previous): say which, and how alike
        out["against"] = {k: previous.get(k) for k in ("experiment_id", "started_at", "changed")}
    return out


__all__ = ["recommend", "diff_recommendations", "goodput"]
