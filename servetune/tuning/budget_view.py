"""What a GPU budget buys: a dry run's trials per stage, and what the budget leaves out of the campaign.

``servetune tune PLAN --dry-run`` runs the campaign on the simulator in virtual time. Under a tight
``budget.max_gpu_minutes`` that campaign stops early and recommends from what it has; a user planning a
weekly GPU window needs to see that before paying for it. The decisions are pure functions of the plan and
the outcomes, so the same dry run with the budget lifted is the campaign the budget cut short, and the
difference between the two is what the budget leaves out. Everything here is a pure function of the two
dry runs' specs and outcomes; ``servetune.commands.tune`` only prints it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from servetune.engines.catalog import command_text
from servetune.plan import Level, TuningPlan
from servetune.result import ALL_STAGES
from servetune.tuning.decisions import next_trials
from servetune.tuning.state import (
    UNPAIRED,
    CampaignState,
    Decision,
    Flags,
    Recommendation,
    TrialOutcome,
    TrialSpec,
    config_key,
)

LIFTED_MINUTES = 1e9  # "no budget": the decisions then stop only where the protocol ends
LEVEL_STAGES = ("baseline", "ramp", "bisect")  # the load curve's stages: their levels are where the ceiling is found


@dataclass(frozen=True)
class DryRun:
    """One simulated campaign: the last decision, every outcome and the spec each ran."""

    decision: Decision
    outcomes: list[TrialOutcome]
    specs: list[TrialSpec]

    @property
    def gpu_seconds(self) -> float:
        return sum(o.gpu_seconds for o in self.outcomes)


def lifted(plan: TuningPlan) -> TuningPlan:
    """The plan without its GPU budget (everything else the same): the campaign the budget would cut short."""
    return plan.model_copy(update={"budget": plan.budget.model_copy(update={"max_gpu_minutes": LIFTED_MINUTES})})


def within_budget(plan: TuningPlan, whole: DryRun, previous: dict[str, Any] | None = None) -> DryRun | None:
    """The budgeted campaign, read off the unlimited one without simulating a trial again: the decisions
    are a pure function of the plan and the outcomes and the budget decides when to stop (and, with a
    robustness check, where the refinement ends: the check keeps its reserve), so under the
    budget the campaign runs the unlimited one's first trials until ``next_trials`` says done. ``plan``: as
    the dry run resolved it (``with_repeats``). None if a decision asks for another trial than the unlimited
    campaign ran (then run the budgeted dry run itself)."""
    state = CampaignState()
    for k, (spec, outcome) in enumerate(zip(whole.specs, whole.outcomes, strict=True)):
        decision = next_trials(plan, state, previous=previous)
        if decision.done:
            return DryRun(decision, whole.outcomes[:k], whole.specs[:k])
        if len(decision.trials) != 1 or measures(decision.trials[0]) != measures(spec):
            return None
        state = state.add(outcome)
    decision = next_trials(plan, state, previous=previous)
    return DryRun(decision, whole.outcomes, whole.specs) if decision.done else None


def dry_runs(plan: TuningPlan, run: Callable[[TuningPlan], DryRun], *, repeats: int = 1,
             previous: dict[str, Any] | None = None) -> tuple[DryRun, DryRun | None]:
    """(the campaign under the plan's budget, the same campaign without it). ``run``: one dry run of a plan;
    ``repeats``: the runner's default (``TuningPlan.with_repeats``). The campaign is simulated once, without
    the budget; the budgeted one is read off it (``within_budget``), simulated only if that fails. The
    unlimited one is None when it does not end within the dry run's trial limit."""
    try:
        whole = run(lifted(plan))
    except RuntimeError:  # no end within the dry run's trial limit: what the budget cuts is unknown
        return run(plan), None
    return within_budget(plan.with_repeats(repeats), whole, previous) or run(plan), whole


def budget_s(plan: TuningPlan) -> float:
    return float(plan.budget.max_gpu_minutes) * 60.0


def may_be_cut(plan: TuningPlan, run: DryRun) -> bool:
    """The budget can only have stopped a campaign that reached it (the decisions stop once it is spent)."""
    return run.gpu_seconds >= budget_s(plan)


def startup_s(o: TrialOutcome, restart_cost_s: float) -> float:
    """The start-up charged on a trial: the seconds the runner kept apart, else the restart cost it charges
    (never more than the trial's own GPU time: a server that failed to start cost its start-up only)."""
    if not o.restarted:
        return 0.0
    kept = o.startup_seconds
    return kept if kept > 0 else min(float(restart_cost_s), o.gpu_seconds)


@dataclass(frozen=True)
class StageRow:
    """One stage of a campaign: how many trials, on how many seeds and server configs, and their GPU time."""

    stage: str
    trials: int
    seeds: int  # distinct workload seeds (seed offsets) its trials ran
    configs: int  # distinct server configs
    starts: int  # trials that (re)started the server
    trial_s: float  # GPU seconds of the trials themselves
    startup_s: float  # GPU seconds of the server start-ups charged on them


def stage_rows(outcomes: list[TrialOutcome], restart_cost_s: float) -> list[StageRow]:
    """Per stage, in the protocol's order; a total row last (stage ``total``) when there is more than one."""
    order = {s: i for i, s in enumerate(ALL_STAGES)}
    groups: dict[str, list[TrialOutcome]] = {}
    for o in outcomes:
        groups.setdefault(o.stage, []).append(o)
    rows = [_row(stage, group, restart_cost_s)
            for stage, group in sorted(groups.items(), key=lambda kv: order.get(kv[0], len(order)))]
    if len(rows) > 1:
        rows.append(_row("total", outcomes, restart_cost_s))
    return rows


def _row(stage: str, group: list[TrialOutcome], restart_cost_s: float) -> StageRow:
    starts = [startup_s(o, restart_cost_s) for o in group]
    return StageRow(stage=stage, trials=len(group), seeds=len({o.seed_offset for o in group}),
                    configs=len({config_key(o.flags) for o in group}), starts=sum(o.restarted for o in group),
                    trial_s=sum(o.gpu_seconds for o in group) - sum(starts), startup_s=sum(starts))


def flags_text(flags: Flags, base: Flags) -> str:
    """A config as the flags it changes from the plan's, typed (``--chunked-prefill-size 4096``); a flag
    turned off or dropped is ``-flag``; the plan's own config is ``-``."""
    changed = {k: v for k, v in flags.items() if k not in base or base[k] != v}
    removed = [k for k in base if k not in flags]
    words = [command_text({k: v}) or f"-{k}" for k, v in changed.items()] + [f"-{k}" for k in removed]
    return " ".join(words) or "-"


@dataclass
class LeftOut:
    """What the unlimited campaign measures that the budgeted one does not (levels as the plan states them)."""

    trials: int = 0
    gpu_seconds: float = 0.0
    levels: list[dict[str, Any]] = field(default_factory=list)  # {stage, level}: never reached
    configs: list[dict[str, Any]] = field(default_factory=list)  # {flags, levels}: refinement configs not measured
    points: list[dict[str, Any]] = field(default_factory=list)  # {flags, level}: a measured config at a new level
    robustness: list[dict[str, Any]] = field(default_factory=list)  # {flags, level, burstiness}: checks not run
    seeds: list[dict[str, Any]] = field(default_factory=list)  # {flags, level, seeds}: at a (config, level) both ran
    resized: list[dict[str, Any]] = field(default_factory=list)  # {flags, level, seeds, requests}: measured again,
    #   longer (the level's trial size grew, so the shorter trial is stale: docs/tuning.md, "Equal sizes")
    recommendation: dict[str, Any] = field(default_factory=dict)  # budgeted / unlimited / differs

    def counts(self) -> list[str]:
        """'2 ramp levels, 3 refinement configs, ...': the summary of the one-line verdict."""
        n_seeds = sum(len(s["seeds"]) for s in self.seeds)
        parts = [(len(self.levels), "level"), (len(self.configs), "refinement config"),
                 (len(self.points), "config at another level"),
                 (len(self.robustness), "robustness check"), (n_seeds, "seed"),
                 (sum(len(r["seeds"]) for r in self.resized), "longer re-run")]
        return [f"{n} {word}{'s' if n != 1 else ''}" for n, word in parts if n]

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _paired(run: DryRun) -> list[TrialOutcome]:
    """The trials at a level's own load (not correctness, bursts or protocols): what comparisons pair."""
    return [o for o in run.outcomes if o.stage not in UNPAIRED]


def _grouped(outs: list[TrialOutcome], base: Flags, **fields: Any) -> dict[Any, dict[str, Any]]:
    """One entry per (config, level) of ``outs``, with its seeds (and any ``fields``), in the order first run."""
    out: dict[Any, dict[str, Any]] = {}
    for o in outs:
        entry = out.setdefault(o.key, {"flags": flags_text(o.flags, base), "level": o.level, **fields})
        if "seeds" in entry and o.seed_offset not in entry["seeds"]:
            entry["seeds"].append(o.seed_offset)
        if "requests" in entry:
            entry["requests"] = max(entry["requests"], o.requests)
    return out


def left_out(plan: TuningPlan, budgeted: DryRun, unlimited: DryRun) -> LeftOut:
    """The unlimited campaign's measurements the budgeted one lacks (set differences, so it holds whether or
    not the budgeted campaign is a prefix of the unlimited one, as it is for a deterministic runner)."""
    base = plan.engine_flags()
    mine, whole = _paired(budgeted), _paired(unlimited)
    reached = {o.level for o in mine}
    new_level = [o for o in whole if o.stage in LEVEL_STAGES and o.level not in reached]
    levels = sorted({(o.stage, o.level) for o in new_level}, key=lambda sl: (LEVEL_STAGES.index(sl[0]), sl[1]))
    measured = {config_key(o.flags) for o in mine}
    configs: dict[str, dict[str, Any]] = {}
    for o in whole:
        if o.stage == "refine" and config_key(o.flags) not in measured:
            entry = configs.setdefault(config_key(o.flags), {"flags": flags_text(o.flags, base), "levels": []})
            entry["levels"] = sorted({*entry["levels"], o.level})
    keys = {o.key for o in mine}
    points = _grouped([o for o in whole if config_key(o.flags) in measured and o.key not in keys
                       and o not in new_level], base)  # a level never reached is listed with the levels
    checks = {_check(o) for o in budgeted.outcomes if o.stage == "robustness"}
    robust = [{"flags": flags_text(o.flags, base), "level": o.level, "burstiness": o.burstiness}
              for o in unlimited.outcomes if o.stage == "robustness" and _check(o) not in checks]
    seeds = {(*o.key, o.seed_offset) for o in mine}
    missing = _grouped([o for o in whole if o.key in keys and (*o.key, o.seed_offset) not in seeds], base, seeds=[])
    size = {}
    for o in mine:
        size[(*o.key, o.seed_offset)] = max(o.requests, size.get((*o.key, o.seed_offset), 0))
    longer = [o for o in whole if o.requests > size.get((*o.key, o.seed_offset), o.requests)]
    return LeftOut(trials=max(0, len(unlimited.outcomes) - len(budgeted.outcomes)),
                   gpu_seconds=max(0.0, unlimited.gpu_seconds - budgeted.gpu_seconds),
                   levels=[{"stage": s, "level": lv} for s, lv in levels], configs=list(configs.values()),
                   points=list(points.values()), robustness=robust, seeds=list(missing.values()),
                   resized=list(_grouped(longer, base, seeds=[], requests=0).values()),
                   recommendation=compare_answers(plan, budgeted.decision.recommendation,
                                                  unlimited.decision.recommendation))


def _check(o: TrialOutcome) -> tuple[str, Level, float | None, int]:
    return (config_key(o.flags), o.level, o.burstiness, o.seed_offset)


def answer(plan: TuningPlan, rec: Recommendation | None) -> dict[str, Any] | None:
    """A recommendation as the budget view compares it: its flags (changed from the plan's), level, goodput."""
    if rec is None:
        return None
    level = rec.rate if plan.rate_mode and rec.rate is not None else rec.concurrency
    return {"flags": flags_text(rec.config, plan.engine_flags()), "level": level, "goodput_rps": rec.goodput_rps}


def compare_answers(plan: TuningPlan, budgeted: Recommendation | None,
                    unlimited: Recommendation | None) -> dict[str, Any]:
    """Whether the budget changes the answer: its config or its level (goodput alone moves with the seeds)."""
    a, b = answer(plan, budgeted), answer(plan, unlimited)
    same = (a is None and b is None) or (a is not None and b is not None
                                         and (a["flags"], a["level"]) == (b["flags"], b["level"]))
    return {"budgeted": a, "unlimited": b, "differs": not same}


@dataclass
class BudgetFit:
    """The budget's outcome for one plan: fits or not, in one line, and what it leaves out when it does not."""

    fits: bool
    spent_s: float  # the budgeted campaign's GPU seconds
    budget_s: float
    whole_s: float  # the campaign without a budget (the same as spent_s when it fits)
    trials: int
    stopped_at: dict[str, Any] | None = None  # {trial, stage}: the first trial the budget prevents
    left_out: LeftOut | None = None

    def line(self) -> str:
        spent, budget, whole = self.spent_s / 60, self.budget_s / 60, self.whole_s / 60
        if self.fits:
            over = (" (its last trial ends past the budget; the campaign was done there)"
                    if self.spent_s > self.budget_s else "")
            return f"fits: {spent:.1f} of {budget:g} GPU min, {self.trials} trials{over}"
        at = ""
        if self.stopped_at is not None:
            at = f" before trial {self.stopped_at['trial']} ({self.stopped_at['stage']})"
        if self.left_out is None:
            return (f"does not fit: the budget stops it at {spent:.1f} of {budget:g} GPU min; without it the"
                    " campaign does not end within the dry run's trial limit, so what it leaves out is unknown")
        gone = ", ".join(self.left_out.counts()) or "nothing measured, only the answer"
        same = "the recommendation differs" if self.left_out.recommendation.get("differs") else \
            "the same recommendation"
        return (f"does not fit: the budget stops it{at} at {spent:.1f} of {budget:g} GPU min (the whole campaign:"
                f" {whole:.1f} GPU min, {self.trials + self.left_out.trials} trials); left out: {gone}; {same}")


def budget_fit(plan: TuningPlan, budgeted: DryRun, unlimited: DryRun | None) -> BudgetFit:
    """``unlimited``: the same dry run under ``lifted(plan)`` (``dry_runs``); None when it has no end, and then
    a budget that was reached (``may_be_cut``) stopped the campaign, what it cut unknown."""
    spent, n = budgeted.gpu_seconds, len(budgeted.outcomes)
    if unlimited is None and may_be_cut(plan, budgeted):
        return BudgetFit(fits=False, spent_s=spent, budget_s=budget_s(plan), whole_s=float("nan"), trials=n)
    if unlimited is None or len(unlimited.outcomes) <= n:
        return BudgetFit(fits=True, spent_s=spent, budget_s=budget_s(plan), whole_s=spent, trials=n)
    stopped = None
    if [measures(s) for s in unlimited.specs[:n]] == [measures(s) for s in budgeted.specs]:
        stopped = {"trial": n + 1, "stage": unlimited.specs[n].stage}
    return BudgetFit(fits=False, spent_s=spent, budget_s=budget_s(plan), whole_s=unlimited.gpu_seconds, trials=n,
                     stopped_at=stopped, left_out=left_out(plan, budgeted, unlimited))


def measures(spec: TrialSpec) -> dict[str, Any]:
    """What a spec measures (its reasons name trial ids, which differ between two dry runs)."""
    return spec.model_dump(exclude={"reason", "sizing"})


def left_out_lines(plan: TuningPlan, gone: LeftOut) -> list[str]:
    """What the budget leaves out, one line per kind, levels in the plan's unit and configs as typed."""
    lv = plan.level_text

    def lvs(levels: list[Level]) -> str:  # "concurrency 16, 24" / "16, 20 req/s"
        nums = ", ".join(f"{x:g}" for x in levels)
        return f"{nums} req/s" if plan.rate_mode else f"concurrency {nums}"

    def cfg(text: str) -> str:
        return "the plan's config" if text == "-" else text

    lines = []
    if gone.levels:
        lines.append("levels never reached: " + ", ".join(f"{lv(g['level'])} ({g['stage']})" for g in gone.levels))
    if gone.configs:
        lines.append("refinement configs not measured: " + "; ".join(
            f"{cfg(c['flags'])} at {lvs(c['levels'])}" for c in gone.configs))
    if gone.points:
        lines.append("configs measured, but not at: " + "; ".join(
            f"{cfg(p['flags'])} at {lv(p['level'])}" for p in gone.points))
    if gone.robustness:
        lines.append("robustness checks not run: " + "; ".join(
            f"{cfg(r['flags'])} at {lv(r['level'])}"
            + ("" if r["burstiness"] is None else f", gamma {r['burstiness']:g}")
            for r in gone.robustness))
    if gone.seeds:
        lines.append("seeds not run (workload seed + k) where both campaigns measure the config and level: "
                     + "; ".join(f"{cfg(s['flags'])} at {lv(s['level'])}:"
                                 f" +{', +'.join(str(x) for x in sorted(s['seeds']))}" for s in gone.seeds))
    if gone.resized:
        lines.append("measured again, longer, where the level's trial size grows: " + "; ".join(
            f"{cfg(r['flags'])} at {lv(r['level'])}, seed +{', +'.join(str(x) for x in sorted(r['seeds']))}"
            f" at {r['requests']} requests" for r in gone.resized))
    rec = gone.recommendation
    if rec.get("differs"):
        def said(a: dict[str, Any] | None) -> str:
            return "no recommendation" if a is None else f"{cfg(a['flags'])} at {lv(a['level'])}"

        lines.append(f"the recommendation differs: {said(rec['budgeted'])} under the budget,"
                     f" {said(rec['unlimited'])} without it")
    return lines
