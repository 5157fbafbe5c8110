"""``servetune tune PLAN.yaml``: run the staged tuning protocol end to end, or show what it would run.

The plan is checked before any server starts (a bad field ends with its path and exit code 2).
Live campaigns start servers through the plan's engine and runner; ``--virtual`` answers every
trial with the simulator in virtual time; ``--dry-run`` prints the trials and the GPU time.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn

import orjson
import typer
from rich.markup import escape
from rich.table import Table

from servetune.commands.jsonout import JsonFlag, use_json
from servetune.commands.outpath import OutPathError, check_out_dir
from servetune.experiment import EXPERIMENT_FILE, RECOMMENDATION_FILE, ResultFolder
from servetune.logs import console as _console
from servetune.names import safe_component
from servetune.oserrors import os_error_text
from servetune.plan import PlanError, TuningPlan, load_plan
from servetune.redact import redact
from servetune.tuning.progress import fmt_s

BAD_INPUT = 2
PAUSED = 75  # EX_TEMPFAIL: stopped by --stop-after, resumable
INTERRUPTED = 130
console = _console(stderr=True)  # progress and errors (--json: stdout holds the document alone)


def _results() -> Any:
    """The answer (the recommendation, a dry run's plan) goes to stdout, so ``> file`` keeps it; under
    ``--json`` stdout holds the document alone and the human text stays on stderr."""
    from servetune.logs import json_mode

    return console if json_mode() else _console()


_TONES = {"info": "", "good": "green", "warn": "yellow", "bad": "red"}


def _progress_printer(plan: TuningPlan, state_of: Any = None) -> Any:
    """One line per trial start and end on stderr (servetune.tuning.progress), the verdict coloured."""
    from servetune.tuning.progress import TrialLine, line_printer

    def emit(line: TrialLine) -> None:
        mark = escape(line.mark)
        if line.mark and (colour := _TONES[line.tone]):
            word, sep, rest = mark.partition(":")
            mark = f"[{colour}]{word}[/{colour}]{sep}{rest}"
        head = f"[bold]{escape(line.head.split(' ', 1)[0])}[/bold] {escape(line.head.split(' ', 1)[1])}"
        console.print("  ".join(part for part in (head, escape(line.body), mark) if part), highlight=False)

    return line_printer(plan, emit, state_of)


def _load(plan_path: Path) -> TuningPlan:
    try:
        return load_plan(plan_path)
    except PlanError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(BAD_INPUT) from None


def _print_recommendation(decision: Any, out: Path) -> None:
    from servetune.engines.catalog import command_text

    console = _results()
    rec = decision.recommendation
    if rec is None:
        console.print(f"[red]no recommendation[/red]: {escape(decision.reason)}")
        return
    table = Table(title="recommendation", show_header=False)
    table.add_row("server flags", command_text(redact(rec.config)) or "(engine defaults)")
    if rec.rate is not None:
        table.add_row("capacity at the SLA", f"{rec.rate:g} req/s (about {rec.concurrency} in flight, Little's law)")
    else:
        table.add_row("concurrency", str(rec.concurrency))
    ci = f" ± {rec.goodput_ci95:.2f} (95% CI over {rec.repeats} repeats)" if rec.goodput_ci95 is not None else ""
    table.add_row("goodput", f"{rec.goodput_rps or 0:.2f} req/s{ci}")
    table.add_row("p99 TTFT / TPOT / E2E",
                  f"{rec.p99_ttft_ms or 0:.0f} / {rec.p99_tpot_ms or 0:.1f} / {rec.p99_e2e_ms or 0:.0f} ms")
    table.add_row("output tokens/s", f"{rec.output_tokens_per_s or 0:.0f}")
    if rec.prefix_hit_rate is not None:
        table.add_row("prefix hit rate", f"{rec.prefix_hit_rate:.1%}")
    table.add_row("evidence", ", ".join(t[:8] for t in rec.evidence_trial_ids))
    console.print(table)
    for line in rec.explanation:
        console.print(f"  - {escape(line)}", highlight=False)
    console.print(f"written to {out}/{RECOMMENDATION_FILE}")


def tune(
    plan_path: Annotated[Path, typer.Argument(metavar="PLAN.yaml", help="the tuning plan")],
    out: Annotated[Path | None, typer.Option("--out", help="result folder (default: runs/<plan name>-<id>)")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the trials and the GPU time; start nothing")]
    = False,
    virtual: Annotated[bool, typer.Option("--virtual", help="answer every trial with the simulator in virtual time")]
    = False,
    previous: Annotated[Path | None, typer.Option(
        help="a previous recommendation.json to diff against (with the plan's warm_start: to start from)")] = None,
    trigger: Annotated[str, typer.Option(help="manual | weekly | on_change | bench")] = "manual",
    dag_run_id: Annotated[str | None, typer.Option(help="the Airflow DAG run, when run from one")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="go on with the campaign in --out (same plan)")] = False,
    stop_after: Annotated[float | None, typer.Option(
        "--stop-after", min=1, help="pause (resumable) before a trial that would end later than this many seconds")
    ] = None,
    json_out: JsonFlag = False,
) -> None:
    """Run a tuning campaign: correctness, baseline, ramp, ceiling, refinement, recommendation."""
    use_json(json_out)
    import time

    from servetune.tuning.campaign import TRIGGERS

    started = time.monotonic()
    plan = _load(plan_path)
    if trigger not in TRIGGERS:  # every option is checked before a dry run returns, as a real run checks it
        console.print(f"[red]error:[/red] --trigger must be one of {', '.join(TRIGGERS)}, got {trigger!r}")
        raise typer.Exit(BAD_INPUT)
    prev = None
    if previous is not None:
        try:
            prev = orjson.loads(previous.read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            console.print(f"[red]error:[/red] --previous {previous}: {escape(str(exc))}")
            raise typer.Exit(BAD_INPUT) from None
        if not isinstance(prev, dict) or "config" not in prev:
            console.print(f"[red]error:[/red] --previous {previous}: not a recommendation.json (no 'config')")
            raise typer.Exit(BAD_INPUT)
    if dry_run:
        from servetune.commands.tune_dry_run import print_dry_run

        print_dry_run(plan, prev)
        return
    if virtual:
        from servetune.tuning.runner import SimTrialRunner

        runner = SimTrialRunner.for_plan(plan)
        if runner is None:
            console.print("[red]error:[/red] --virtual needs engine.kind sim or an `estimate:` section in the plan")
            raise typer.Exit(BAD_INPUT)
    else:
        from servetune.tuning.live import LiveTrialRunner

        runner = LiveTrialRunner(plan)
    from servetune.campaign_lock import CampaignBusy, campaign_lock

    deadline = started + stop_after if stop_after is not None else None
    campaign: Any = None
    try:
        with ExitStack() as held:  # one writer per campaign folder (servetune.campaign_lock)
            if resume and out is not None:
                held.enter_context(campaign_lock(out))
            campaign = _open_campaign(plan, runner, out, resume=resume, trigger=trigger, dag_run_id=dag_run_id,
                                      previous=prev, virtual=virtual)
            if not resume:
                held.enter_context(campaign_lock(campaign.out))
            with _signals_interrupt() as signalled:
                decision = campaign.run(deadline=deadline, stop=lambda: bool(signalled))
    except CampaignBusy as exc:
        _fail(f"--resume: {exc}; wait for it to end, or stop it first")
    except OSError as exc:  # a disk that filled, a folder that went away: the campaign resumes once it is fixed
        if campaign is None:
            _fail(os_error_text(exc))
        _emit(campaign, "interrupted")
        _fail(f"{os_error_text(exc)}; the campaign stopped after {len(campaign.state.outcomes)} trials, nothing"
              f" measured is lost: fix that, then go on with: {_go_on(plan_path, campaign.out, virtual)}")
    except KeyboardInterrupt:
        _emit(campaign, "interrupted")
        console.print(f"interrupted after {len(campaign.state.outcomes)} trials: engine torn down; go on with:"
                      f" {_go_on(plan_path, campaign.out, virtual)}", highlight=False, soft_wrap=True)
        raise typer.Exit(INTERRUPTED) from None
    spent = f"({len(campaign.state.outcomes)} trials, {fmt_s(campaign.state.gpu_seconds)} GPU)"
    _emit(campaign, "paused" if not decision.done else "failed" if decision.failed else "done", decision)
    if not decision.done:
        console.print(f"paused before the next {decision.stage} trial: --stop-after {stop_after:g} s {spent};"
                      f" go on with: {_go_on(plan_path, campaign.out, virtual)}",
                      highlight=False, soft_wrap=True)
        raise typer.Exit(PAUSED)
    _results().print(f"done: {escape(decision.reason)} {spent}", highlight=False)
    _print_recommendation(decision, campaign.out)
    if decision.failed:
        raise typer.Exit(1)


def _emit(campaign: Any, status: str, decision: Any = None) -> None:
    """``servetune tune --json``: the campaign's outcome as one JSON document on stdout."""
    from servetune.logs import emit_json, json_mode

    if json_mode():
        emit_json({"status": status, "experiment_id": campaign.experiment_id, "out": str(campaign.out),
                   "trials": len(campaign.state.outcomes), "gpu_seconds": round(campaign.state.gpu_seconds, 3),
                   "reason": decision.reason if decision is not None else None,
                   "recommendation": _shown(decision.recommendation) if decision is not None else None})


def _shown(rec: Any) -> Any:
    """A recommendation safe for stdout: a secret flag's value masked like every other output."""
    return None if rec is None else redact(rec.model_dump(mode="json"))


def _open_campaign(plan: TuningPlan, runner: Any, out: Path | None, *, resume: bool, trigger: str,
                   dag_run_id: str | None, previous: dict[str, Any] | None, virtual: bool) -> Any:
    """A new campaign in an empty folder, or (``--resume``) the one already in ``out``; one line if neither."""
    import uuid

    from servetune.tuning.campaign import Campaign
    from servetune.tuning.decisions import next_trials

    kwargs: dict[str, Any] = dict(previous=previous, progress=_progress_printer(plan, lambda: campaign.state))
    if resume:
        stored = _stored_experiment(out)
        kwargs.update(trigger=stored.get("trigger") or trigger, dag_run_id=stored.get("dag_run_id") or dag_run_id,
                      experiment_id=stored["experiment_id"])
        try:
            campaign = Campaign.resume(plan, runner, out, **kwargs)  # type: ignore[arg-type]
        except ValueError as exc:
            _fail(f"--resume: {exc}")
        if next_trials(campaign.plan, campaign.state, previous=previous).done:  # a finished one can reopen when
            _fail(f"--resume: the campaign in {out} is done already")  # the decisions now ask for more

        console.print(f"campaign {campaign.experiment_id[:8]}: resumed in {out} after"
                      f" {len(campaign.state.outcomes)} trials", highlight=False)
        return campaign
    experiment_id = uuid.uuid4().hex
    out = out or Path("runs") / f"{safe_component(plan.name)}-{experiment_id[:8]}"
    try:
        check_out_dir(out, parents=True)  # a symlink loop, a missing or read-only parent: said before the first trial
    except OutPathError as exc:
        _fail(str(exc))
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        _fail(f"--out {out} is not an empty folder: pass --resume to go on with the campaign there,"
              " or choose a new folder")
    console.print(f"campaign {experiment_id[:8]}: plan {plan.name}, engine {plan.engine.kind}"
                  f"{' (virtual time)' if virtual else ''}, results in {out}", highlight=False)
    campaign = Campaign(plan, runner, out, trigger=trigger, dag_run_id=dag_run_id, experiment_id=experiment_id,
                        **kwargs)
    return campaign


def _stored_experiment(out: Path | None) -> dict[str, Any]:
    if out is None:
        _fail("--resume needs --out: the folder of the campaign to go on with")
    try:
        stored = ResultFolder(out).read_experiment()
    except OSError as exc:
        why = "not there: is this a campaign folder?" if isinstance(exc, FileNotFoundError) else os_error_text(exc)
        _fail(f"--resume: {out}/{EXPERIMENT_FILE}: {why}")
    except orjson.JSONDecodeError as exc:
        _fail(f"--resume: {out}/{EXPERIMENT_FILE} is damaged ({exc})")
    if not isinstance(stored, dict) or not stored.get("experiment_id"):
        _fail(f"--resume: {out}/{EXPERIMENT_FILE} names no experiment_id")
    return stored


def _go_on(plan_path: Path, out: Path, virtual: bool) -> str:
    """The command that continues this campaign: a virtual one resumes in virtual time, never on the engine."""
    return f"servetune tune {plan_path} --out {out} --resume" + (" --virtual" if virtual else "")


def _fail(message: str) -> NoReturn:
    console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)  # one line, unwrapped
    raise typer.Exit(BAD_INPUT)


@contextmanager
def _signals_interrupt() -> Iterator[list[int]]:
    """SIGTERM (a scheduler, ``timeout``) ends the campaign like Ctrl-C: engine torn down, status interrupted.

    Yields the signals received (SIGINT and SIGTERM): the campaign also stops on that list between
    trials, since a ``KeyboardInterrupt`` raised inside a finaliser or an event-loop callback is swallowed."""
    received: list[int] = []

    def _raise(signum: int, frame: Any) -> None:
        received.append(signum)
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        old = signal.signal(signal.SIGTERM, _raise)
    except ValueError:  # not the main thread (an embedding caller): leave signals alone
        yield received
        return
    old_int = signal.getsignal(signal.SIGINT)
    if old_int is signal.default_int_handler:  # Ctrl-C as Python has it (an ignored SIGINT stays ignored)
        signal.signal(signal.SIGINT, _raise)
    try:
        yield received
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old)


def register(app: typer.Typer) -> None:
    app.command("tune")(tune)
