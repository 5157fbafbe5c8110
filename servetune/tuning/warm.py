"""Warm start: a weekly or change-triggered campaign begins from the last accepted answer for the same service.

A service that was tuned last week has an answer; walking the whole ladder again from the baseline spends most
of a GPU window re-learning it. With ``warm_start`` and a like-for-like previous answer (servetune.warehouse.previous:
the same model, workload, SLA, load mode, engine kind and GPU; ``changed`` empty), the campaign measures that
answer's config at its level on every seed first (the same seeds every campaign uses, so the comparison with last
week is paired by construction). If it still passes, the walk goes on from there: the levels above it with the same
config (the ceiling may have moved up), the bisection below the first failure, then the refinement starting from
its flags, one step each way along each grid flag. The level right above the answer failed on every seed when the
answer was found, so failing on its first seed again says the ceiling has not moved (passing there, it climbs on
under the usual rules). If the answer fails, the ceiling moved down, not away: the walk goes down the ladder from
it to the first level that passes and bisects between that one and the lowest failure, then refines as above; the
full walk from the baseline runs only when nothing below passes, or the service changed, and the explanation
says why.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from servetune.plan import Level, TuningPlan
from servetune.redact import MASK
from servetune.tuning.ceiling import adaptive_gather, climb, conclude, make_ceiling, ramp_levels, walk_seeds
from servetune.tuning.evidence import Evidence, gather, size_band
from servetune.tuning.sizing import size_trial
from servetune.tuning.state import CampaignState, Ceiling, Flags, TrialSize, TrialSpec


def warm_answer(plan: TuningPlan, previous: dict[str, Any] | None) -> tuple[Flags, Level, str] | None:
    """The previous answer's flags (over the plan's own, its masked secrets left to the plan), its level and where it
    came from; None when the plan does not warm-start or there is no like-for-like answer to start from."""
    if not plan.warm_start or not previous or previous.get("changed"):
        return None
    level = previous.get("rate") if plan.rate_mode else previous.get("concurrency")
    config = previous.get("config")
    if not isinstance(level, int | float) or level <= 0 or not isinstance(config, dict):
        return None
    flags = dict(plan.engine_flags())
    flags.update({k: v for k, v in config.items() if v != MASK})
    source = f"experiment {str(previous['experiment_id'])[:8]}" if previous.get("experiment_id") else "--previous"
    return flags, level, source


def confirm(plan: TuningPlan, state: CampaignState, previous: dict[str, Any] | None
            ) -> TrialSpec | tuple[Flags, Ceiling] | str | None:
    """The next trial of the warm start, or its ceiling and the flags it holds for; a str saying why the full walk
    runs instead (no like-for-like answer, or neither it nor any ladder level below it passes); None when the plan
    does not warm-start."""
    if not plan.warm_start:
        return None
    found = warm_answer(plan, previous)
    if found is None:
        if previous and previous.get("changed"):
            return (f"warm start: the service changed since the last answer ({', '.join(previous['changed'])});"
                    " the full walk")
        return "warm start: no previous answer with a level for this service; the full walk"
    flags, level, source = found
    at = plan.level_text(level)
    ev = gather(plan, state, flags, level, stage="ramp", reason=f"warm start: confirm the last accepted answer"
                f" ({source}) at {at}", repeats=plan.repeat_count, size=_size(plan, state, flags, level, previous))
    if isinstance(ev, TrialSpec):
        return ev
    if not ev.passed:
        return _below(plan, state, flags, level, ev, f"warm start: the last accepted answer ({source}) no longer"
                      f" holds {at} ({'; '.join(ev.verdict.reasons)})")
    above = [x for x in ramp_levels(plan) if x > level]
    walked = climb(plan, state, flags, above, "ramp", "warm start: above the confirmed answer", ev)
    if isinstance(walked, TrialSpec):
        return walked
    held = f"warm start: the last accepted answer ({source}) still holds {at} on {ev.n} seed(s) (goodput" \
           f" {ev.goodput.text()} req/s)"
    best, last_pass, stop, plateau = walked
    if stop is not None and not stop.passed and best is ev and stop.level == above[0]:
        # the level right above fails as it did when the answer was found (there on every seed, and the level
        # between was bisected then): the ceiling has not moved, and its first seed says so
        v = stop.verdict
        return flags, make_ceiling(plan, state, flags, ev, ev, stop, v.kind if v.kind != "pass" else "sla",
                                   [f"{held}; level {stop.level:g} above it fails on {stop.n} seed(s), as when the"
                                    f" answer was found: " + "; ".join(v.reasons)])
    ceiling = conclude(plan, state, flags, best, last_pass, stop, plateau)
    if isinstance(ceiling, TrialSpec):
        return ceiling
    ceiling.reasons.insert(0, f"{held}; the walk went on from there")
    return flags, ceiling


def _below(plan: TuningPlan, state: CampaignState, flags: Flags, level: Level, failed: Evidence, why: str
           ) -> TrialSpec | tuple[Flags, Ceiling] | str:
    """The answer failed: the ladder's levels below it, highest first, until one passes, then the usual ceiling
    rules between that level and the lowest one that failed (the bisection, the deciding levels' seeds). The answer
    moved down, not away: what is above it failed and what is far below it passed a week ago, so the walk from the
    baseline would re-learn both. The full walk only when nothing below passes either."""
    stop = failed
    for lower in sorted((x for x in ramp_levels(plan) if x < level), reverse=True):
        ev = adaptive_gather(plan, state, flags, lower, stage="ramp", reason=f"warm start: below the answer that"
                             f" failed: level {lower:g}", repeats=walk_seeds(plan))
        if isinstance(ev, TrialSpec):
            return ev
        if not ev.passed:
            stop = ev
            continue
        ceiling = conclude(plan, state, flags, ev, ev, stop, False)
        if isinstance(ceiling, TrialSpec):
            return ceiling
        ceiling.reasons.insert(0, f"{why}; the walk went down from there, to {plan.level_text(lower)}, which passes")
        return flags, ceiling
    return f"{why}; nothing below it on the ladder passes either: the full walk"


def _size(plan: TuningPlan, state: CampaignState, flags: Flags, level: Level, previous: dict[str, Any] | None
          ) -> tuple[int, int, str]:
    """The size the previous answer's trials ran at (under this plan's per-trial cap): last week's verdict and
    this week's compare at equal sizes, and a re-run above it that cannot grow keeps the band's trials current.
    In an open loop a short warm-up flatters a rate at the edge (the queue has not built up yet), so a
    confirmation sized afresh could pass where the answer's own size fails. An answer that does not say (written
    before it was kept, or saying nonsense) is sized as a first trial, from its goodput where the campaign has only
    its correctness trial to go by (``_prior``)."""
    try:
        size = TrialSize.model_validate((previous or {}).get("trial_size"))
    except ValidationError:
        return size_trial(plan, state, flags, size_band(plan, level), "ramp", prior=_prior(plan, previous))
    requests = min(size.requests, plan.budget.max_requests_per_trial)
    return requests, size.warmup, f"the last accepted answer's trial size ({size.requests}+{size.warmup})"


def _prior(plan: TuningPlan, previous: dict[str, Any] | None) -> tuple[float, str] | None:
    """The previous answer's goodput, to size the confirming trials by (a closed loop's rate at that level)."""
    rate = (previous or {}).get("goodput_rps")
    if plan.rate_mode or not isinstance(rate, int | float) or rate <= 0:
        return None
    return float(rate), f"{rate:.2f} req/s, the last accepted answer's goodput at this level"


__all__ = ["confirm", "warm_answer"]
