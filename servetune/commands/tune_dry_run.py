"""``servetune tune PLAN --dry-run``: the trials the campaign would start, per stage, and what its budget buys.

The campaign runs on the simulator in virtual time (``servetune.tuning.campaign.dry_run``); what the GPU
budget leaves out is ``servetune.tuning.budget_view``'s to work out. This module only prints: the trial
table, the per-stage table, the budget's outcome in one line and what it leaves out; under ``--json``
the same as one document on stdout (keys ``trials``, ``stages``, ``fits``, ``left_out``, ...).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from rich.markup import escape
from rich.table import Table

from servetune.logs import console as _console
from servetune.plan import TuningPlan
from servetune.redact import redact
from servetune.tuning.progress import fmt_s

console = _console(stderr=True)  # under --json: the human text (stdout holds the document alone)
console.soft_wrap = True  # as servetune.cli makes every command's stderr console


def _results() -> Any:
    """stdout, so ``> file`` keeps the dry run; stderr under ``--json``."""
    from servetune.logs import json_mode

    return console if json_mode() else _console()


def _shown(rec: Any) -> Any:
    """A recommendation safe for stdout: a secret flag's value masked like every other output."""
    return None if rec is None else redact(rec.model_dump(mode="json"))


def print_dry_run(plan: TuningPlan, previous: dict[str, Any] | None = None) -> None:
    """The simulated campaign's trials, its stages and what its GPU budget buys (servetune.tuning.budget_view)."""
    console = _results()
    from servetune.engines.catalog import command_text
    from servetune.logs import emit_json, json_mode
    from servetune.tuning import budget_view as bv
    from servetune.tuning.campaign import dry_run
    from servetune.tuning.runner import SimTrialRunner

    runner = SimTrialRunner.for_plan(plan)
    if runner is None:
        _print_static_schedule(plan)
        return
    if plan.estimate is not None and plan.engine.kind != "sim":
        console.print(f"estimating with the simulator: {plan.estimate.model} on {plan.estimate.gpu}")
    # an estimate: the simulator's trials against the validity rules only (the checklist's GX suites cost
    # about half a second a trial, and a real campaign runs them on every trial it measures)
    def run(p: TuningPlan) -> bv.DryRun:
        return bv.DryRun(*dry_run(p, SimTrialRunner.for_plan(p), checklist=False,  # type: ignore[arg-type]
                                  previous=previous))

    # simulated once without the budget; the campaign under it is read off that (budget_view.dry_runs)
    budgeted, unlimited = bv.dry_runs(plan, run, repeats=runner.default_repeats, previous=previous)
    decision, outcomes, specs = budgeted.decision, budgeted.outcomes, budgeted.specs
    fit = bv.budget_fit(plan, budgeted, unlimited)
    rows = bv.stage_rows(outcomes, runner.restart_cost_s)
    table = Table(title=f"{plan.name}: trials the campaign would start (simulated, virtual time)")
    for col in ("#", "stage", f"level ({plan.level_unit})", "requests", "flags changed", "GPU s", "goodput req/s",
                "valid"):
        table.add_column(col, no_wrap=col in ("stage", "requests", "valid"))
    base = plan.engine_flags()
    for i, (spec, o) in enumerate(zip(specs, outcomes, strict=True), 1):
        valid = "-" if spec.stage == "correctness" else ("yes" if o.valid else "INVALID")
        table.add_row(str(i), spec.stage, f"{spec.level:g}", f"{spec.requests}+{spec.warmup}",
                      bv.flags_text(spec.flags, base), f"{o.gpu_seconds:.0f}" + ("*" if o.restarted else ""),
                      f"{o.summary.goodput_rps or 0:.2f}" if o.status == "ok" else "failed", valid)
    console.print(table)
    console.print("* the server (re)starts for this trial (its GPU s include the restart)")
    _print_stages(rows, console)
    total = budgeted.gpu_seconds
    if json_mode():
        emit_json({"plan": plan.name, "simulated": True, "estimated_gpu_s": round(total, 3),
                   "trials": [{"stage": sp.stage, "level": sp.level, "requests": sp.requests, "warmup": sp.warmup,
                               "flags": redact(sp.flags), "gpu_seconds": round(o.gpu_seconds, 3), "status": o.status,
                               "goodput_rps": o.summary.goodput_rps, "valid": o.valid}
                              for sp, o in zip(specs, outcomes, strict=True)],
                   "stages": [{**asdict(r), "trial_s": round(r.trial_s, 3), "startup_s": round(r.startup_s, 3)}
                              for r in rows],
                   "fits": fit.fits, "budget_gpu_s": fit.budget_s, "budget": fit.line(),
                   "whole_campaign_gpu_s": None if unlimited is None else round(fit.whole_s, 3),
                   "left_out": redact(fit.left_out.as_json()) if fit.left_out else None,
                   "recommendation": _shown(decision.recommendation), "reason": decision.reason})
    rules = plan.validation
    repeats = plan.repeats.count or runner.default_repeats
    console.print(f"{len(specs)} trials, estimated GPU time {fmt_s(total)} (budget {plan.budget.max_gpu_minutes:g} min,"
                  f" restart cost {plan.budget.restart_cost_s:g} s each); the simulator's estimate, not a measurement.")
    _print_fit(plan, fit, console)
    if plan.protocols:
        console.print(f"Before them, once each, the plan's protocols: {', '.join(p.name for p in plan.protocols)}"
                      " (their own workload, flags and batching; not counted above).", highlight=False)
    per = "requests in flight" if plan.rate_mode else "streams"
    console.print(f"Each trial is sized for a steady window of >= {rules.min_window_s:g} s and >= max("
                  f"{rules.min_completions}, {rules.completions_per_stream:g} x {per}) completions"
                  f" (requests = measured + warm-up); decisive trials: {repeats} trial(s) each")
    if plan.rate_mode:
        assert plan.load is not None
        console.print(f"Open loop: levels are offered requests/s, {plan.load.arrivals_text()},"
                      f" at most {plan.load.max_in_flight} in flight")
    if decision.recommendation:
        r = decision.recommendation
        at = f"capacity {r.rate:g} req/s (about {r.concurrency} in flight)" if r.rate is not None \
            else f"concurrency {r.concurrency}"
        console.print(f"simulated recommendation: {at}, flags {command_text(redact(r.config)) or '(defaults)'},"
                      f" goodput {r.goodput_rps or 0:.2f} req/s", highlight=False)
    else:
        console.print(f"simulated campaign ends without a recommendation: {escape(decision.reason)}")


def _print_stages(rows: list[Any], console: Any) -> None:
    """Per stage: trials, seeds, server configs and starts, GPU minutes of trials and of start-ups apart."""
    table = Table(title="per stage (GPU minutes: trials and server start-ups apart)")
    for col in ("stage", "trials", "seeds", "configs", "server starts", "trial GPU min", "start-up GPU min"):
        table.add_column(col, justify="left" if col == "stage" else "right", no_wrap=True)
    for i, r in enumerate(rows):
        before_total = i + 2 == len(rows) and rows[-1].stage == "total"
        table.add_row(r.stage, str(r.trials), str(r.seeds), str(r.configs), str(r.starts), f"{r.trial_s / 60:.1f}",
                      f"{r.startup_s / 60:.1f}", style="bold" if r.stage == "total" else None, end_section=before_total)
    console.print(table)


def _print_fit(plan: TuningPlan, fit: Any, console: Any) -> None:
    """The budget's outcome in one line, then what it leaves out (redacted: a secret flag's value stays masked)."""
    from servetune.tuning.budget_view import left_out_lines

    colour = "green" if fit.fits else "yellow"
    word, _, rest = fit.line().partition(":")
    console.print(f"budget: [{colour}]{word}[/{colour}]:{escape(rest)}", highlight=False)
    if fit.left_out is not None:
        for line in left_out_lines(plan, fit.left_out):
            console.print(f"  - {escape(redact(line))}", highlight=False)


def _print_static_schedule(plan: TuningPlan) -> None:
    """Without a simulator profile: the worst-case trial list; GPU time cannot be estimated."""
    console = _results()
    from servetune.tuning.costs import remaining_trials_upper_bound
    from servetune.tuning.state import CampaignState

    st = plan.stages
    table = Table(title=f"{plan.name}: trials the campaign would start (worst case; no simulator profile)")
    for col in ("stage", f"levels ({plan.level_unit})", "requests each"):
        table.add_column(col)
    if st.correctness.enabled:
        table.add_row("correctness", "1", str(st.correctness.requests))
    table.add_row("baseline", f"{plan.baseline_level:g}", str(st.baseline.requests + st.baseline.warmup))
    table.add_row("ramp", ", ".join(f"{x:g}" for x in st.ramp.levels) + " (stops at the ceiling)",
                  str(st.ramp.requests + st.ramp.warmup))
    if st.ramp.bisect:
        step = st.ramp.rate_step
        gap = f"{step:.1%} of the failing rate" if plan.rate_mode else str(st.ramp.bisect_min_step)
        table.add_row("bisect", f"between last pass and first fail, down to a gap of {gap}",
                      str(st.ramp.requests + st.ramp.warmup))
    if st.refine.enabled:
        walk = ", ".join(f"{k} {v}" for k, v in st.refine.grid.items())
        table.add_row("refine", f"at the ceiling, one flag at a time: {walk}", str(plan.refine_requests()[0]))
    console.print(table)
    n = remaining_trials_upper_bound(plan, CampaignState(), "correctness")
    from servetune.logs import emit_json, json_mode

    if json_mode():
        emit_json({"plan": plan.name, "simulated": False, "max_trials": n, "estimated_gpu_s": None,
                   "stages": None, "fits": None, "left_out": None})
    console.print(f"at most {n} trials; GPU time cannot be estimated for engine {plan.engine.kind!r}: the"
                  " simulator models SGLang only (for an sglang plan add `estimate: {gpu: ..., model: ...}`)."
                  f" The budget caps it at {plan.budget.max_gpu_minutes:g} min.")
