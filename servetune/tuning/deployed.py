"""The answer against the flags that run in production: the plan's own engine flags.

A recommendation is compared with last week's answer (``diff_from_previous``), but an operator deploys the
plan's flags, not last week's answer. When the refinement changed a flag, the answer says what it changed and
how the plan's flags fared at the answer's level, from the campaign's own trials there (the ramp measured them
on the same seeds); when those flags were not measured at that level, it says so instead of guessing.
"""

from __future__ import annotations

from typing import Any

from servetune.plan import TuningPlan
from servetune.tuning.evidence import current
from servetune.tuning.state import CampaignState, Flags, Level, config_key


def flag_changes(old: Flags, new: Flags, names: tuple[str, str] = ("old", "new")) -> dict[str, dict[str, Any]]:
    """Every flag set differently in ``old`` and ``new`` (absent: None), as ``{flag: {names[0]: .., names[1]: ..}}``."""
    return {k: {names[0]: old.get(k), names[1]: new.get(k)}
            for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}


def against_deployed(plan: TuningPlan, state: CampaignState, flags: Flags, level: Level,
                     goodput: float | None) -> dict[str, Any] | None:
    """None when the answer is the plan's own flags; else the flags it changed and the plan's flags' goodput and
    verdict at the answer's level (``measured`` False when no accepted trial of them is there)."""
    deployed = plan.engine_flags()
    if config_key(dict(flags)) == config_key(deployed):
        return None
    changed = flag_changes(deployed, flags, ("deployed", "answer"))
    ev = current(plan, state, deployed, level)
    out: dict[str, Any] = {"config": changed, "level": level, "measured": ev.n > 0, "trial_ids": ev.trial_ids}
    if ev.n:
        base = ev.goodput.mean
        out.update(goodput_rps=base, passed=ev.passed, repeats=ev.n,
                   change=(goodput / base - 1) if goodput is not None and base else None)
    return out


def describe(plan: TuningPlan, vs: dict[str, Any] | None) -> str | None:
    """One explanation line: what the answer changes from the plan's flags, and by how much it beats them."""
    if vs is None:
        return None
    flags = ", ".join(f"--{k} {v['deployed']} -> {v['answer']}" for k, v in vs["config"].items())
    where = plan.level_text(vs["level"])
    if not vs["measured"]:
        return f"against the plan's own flags (what runs today): {flags}; not measured at {where}"
    change = f" ({vs['change']:+.1%} for the answer)" if vs.get("change") is not None else ""
    verdict = "met" if vs["passed"] else "missed"
    return (f"against the plan's own flags (what runs today): {flags}; at {where} they serve"
            f" {vs['goodput_rps']:.3g} req/s of goodput over {vs['repeats']} seed(s) and {verdict} the SLA{change}")


__all__ = ["against_deployed", "describe", "flag_changes"]
