"""The plan's objective: which passing config and level the campaign recommends.

Capacity is measured the same way whatever the objective: the ramp climbs on goodput and the refinement
compares configs on goodput, so the ceiling is the SLA's. Then the answer is the passing (config, level)
pair, among every one the campaign measured, with the best objective figure: good requests per joule
(``goodput_per_watt``: goodput over the window's mean GPU power) or output tokens per dollar (``cost_per_mtok``: the
fewest dollars per million output tokens). A pair whose figure is not better than the goodput answer's beyond the noise
(paired over the seeds both were measured on) and ``refine.min_improvement`` is a tie, and the goodput answer stays.
"""

from __future__ import annotations

from servetune.plan import TuningPlan
from servetune.result import TrialSummary
from servetune.stats import paired_compare
from servetune.tuning.evidence import Evidence, passing
from servetune.tuning.state import CampaignState, TrialOutcome

UNITS = {"goodput": "req/s", "goodput_per_watt": "good req/kJ", "cost_per_mtok": "Mtok/$"}  # of figure()


def figure(objective: str, s: TrialSummary) -> float | None:
    """Higher is better: req/s, good requests per kJ, or million output tokens per dollar."""
    if objective == "goodput":
        return s.goodput_rps
    if objective == "goodput_per_watt":
        return (s.goodput_rps or 0.0) / s.gpu_power_window_mean_w * 1e3 if s.gpu_power_window_mean_w else None
    return 1.0 / s.cost_per_mtok_usd if s.cost_per_mtok_usd else None


def shown(objective: str, value: float) -> str:
    """The figure as people quote it (cost as $/Mtok, not its inverse)."""
    return f"${1.0 / value:.3g}/Mtok" if objective == "cost_per_mtok" else f"{value:.3g} {UNITS[objective]}"


def _by_seed(objective: str, ev: Evidence) -> dict[int, float] | None:
    values = {o.seed_offset: figure(objective, o.summary) for o in ev.outcomes}
    return None if not values or any(v is None for v in values.values()) else values  # type: ignore[return-value]


def by_objective(plan: TuningPlan, state: CampaignState, chosen: TrialOutcome) -> tuple[TrialOutcome, list[str]]:
    """The passing (config, level) the objective prefers to ``chosen``, the goodput answer, and why."""
    objective = plan.objective
    if objective == "goodput":
        return chosen, []
    scored = [(ev, values) for ev in passing(plan, state) if (values := _by_seed(objective, ev)) is not None]
    base = next(((ev, v) for ev, v in scored if ev.flags == chosen.flags and ev.level == chosen.level), None)
    if base is None:
        return chosen, [f"objective {objective}: the goodput answer has no {UNITS[objective]} figure; it stands"]

    def mean(v: dict[int, float]) -> float:
        return sum(v.values()) / len(v)

    best, values = max(scored, key=lambda x: mean(x[1]))
    if best is base[0]:
        return chosen, [f"objective {objective}: the goodput answer is also the best of {len(scored)} passing"
                        f" config and level pair(s) ({shown(objective, mean(values))})"]
    cmp = paired_compare(values, base[1], min_change=plan.stages.refine.min_improvement)
    text = (f"{_where(plan, best, chosen)} ({shown(objective, mean(values))}) against the goodput answer"
            f" {plan.level_text(chosen.level)} ({shown(objective, mean(base[1]))}; {cmp.text(UNITS[objective])})")
    if cmp.outcome != "better" or best.representative is None:
        return chosen, [f"objective {objective}: a tie: {text}; the goodput answer stands"]
    return best.representative, [f"objective {objective}: {text}; the answer runs there"]


def _where(plan: TuningPlan, ev: Evidence, chosen: TrialOutcome) -> str:
    """The level, and the flags where they differ from the goodput answer's."""
    if ev.flags == chosen.flags:
        return plan.level_text(ev.level)
    flags = ", ".join(f"--{k} {v}" for k, v in sorted(ev.flags.items())) or "engine defaults"
    return f"{plan.level_text(ev.level)} with {flags}"


__all__ = ["UNITS", "by_objective", "figure", "shown"]
