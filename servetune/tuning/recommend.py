"""The recommendation: the chosen config with its evidence, its figures, why, and what changed."""

from __future__ import annotations

from typing import Any

from servetune.plan import TuningPlan
from servetune.tuning import signals
from servetune.tuning.refine import RefineResult, goodput
from servetune.tuning.state import CampaignState, Ceiling, Recommendation, TrialOutcome


def recommend(
    plan: TuningPlan, state: CampaignState, ceiling: Ceiling, refined: RefineResult | None,
    previous: dict[str, Any] | None = None, notes: list[str] | None = None,
) -> Recommendation | None:
    """Build the recommendation from the refined best (or the ceiling trial); None when nothing passed."""
    chosen: TrialOutcome | None = refined.best if refined else None
    if chosen is None and ceiling.pass_trial_id is not None:
        chosen = next(o for o in state.outcomes if o.trial_id == ceiling.pass_trial_id)
    if chosen is None:
        return None
    s = chosen.summary
    evidence = [chosen.trial_id]
    for tid in [*(o.trial_id for o in state.by_stage("baseline")), ceiling.pass_trial_id, ceiling.fail_trial_id,
                *(refined.compared if refined else [])]:
        if tid and tid not in evidence:
            evidence.append(tid)
    explanation = [f"ceiling at concurrency {ceiling.level} ({ceiling.kind}): " + "; ".join(ceiling.reasons)]
    if refined:
        explanation.extend(refined.notes or ["no refinement step beat the ramp's config by more than"
                                             f" {plan.stages.refine.min_improvement:.0%}"])
    explanation.extend(signals.describe(s, chosen.concurrency))
    if s.prefix_hit_rate is not None:
        explanation.append(f"prefix hit rate {s.prefix_hit_rate:.1%} (cached/prompt tokens from usage)")
    explanation.extend(notes or [])
    rec = Recommendation(
        config=dict(chosen.flags),
        concurrency=chosen.concurrency,
        evidence_trial_ids=evidence,
        goodput_rps=s.goodput_rps,
        p99_ttft_ms=s.ttft_ms.p99,
        p99_tpot_ms=s.tpot_ms.p99,
        p99_e2e_ms=s.e2e_ms.p99,
        output_tokens_per_s=s.output_tokens_per_s,
        prefix_hit_rate=s.prefix_hit_rate,
        explanation=explanation,
    )
    if previous is not None:
        rec.diff_from_previous = diff_recommendations(previous, rec)
    return rec


def diff_recommendations(previous: dict[str, Any], current: Recommendation) -> dict[str, Any]:
    """Flags added/removed/changed, the concurrency and the figures, old -> new."""
    old_cfg: dict[str, Any] = previous.get("config") or {}
    new_cfg = current.config
    changed = {k: {"old": old_cfg.get(k), "new": new_cfg.get(k)}
               for k in sorted(set(old_cfg) | set(new_cfg)) if old_cfg.get(k) != new_cfg.get(k)}
    figures: dict[str, Any] = {}
    for name in ("concurrency", "goodput_rps", "p99_ttft_ms", "p99_tpot_ms", "p99_e2e_ms",
                 "output_tokens_per_s", "prefix_hit_rate"):
        old, new = previous.get(name), getattr(current, name)
        entry: dict[str, Any] = {"old": old, "new": new}
        if isinstance(old, int | float) and isinstance(new, int | float) and old:
            entry["change"] = new / old - 1
        figures[name] = entry
    return {"config": changed, "figures": figures, "same_config": not changed}


__all__ = ["recommend", "diff_recommendations", "goodput"]
