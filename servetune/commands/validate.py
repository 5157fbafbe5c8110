"""``servetune validate RESULT``: the report checklist alone (exit 1 when the trial is rejected)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from servetune.commands.db import BAD_INPUT
from servetune.commands.jsonout import JsonFlag, use_json

CAMPAIGN_FILES = {"experiment.json", "recommendation.json", "state.json", "plan.json"}  # not trials


def _observed(value: object) -> str:
    """GX's observed value, short: a column map's unexpected values rather than its whole result dict."""
    if isinstance(value, dict) and "unexpected_count" in value:
        bad = value.get("partial_unexpected_list") or []
        return f"{value['unexpected_count']} of {value.get('element_count', '?')} unexpected {bad[:3]}" \
            if value["unexpected_count"] else f"{value.get('element_count', '?')} rows ok"
    return str(value)


def _folder_plan(folder: Path) -> dict[str, Any]:
    """The plan a campaign folder's experiment.json recorded ({} when there is none to read)."""
    try:
        plan = orjson.loads((folder / "experiment.json").read_bytes()).get("plan")
    except (OSError, orjson.JSONDecodeError, AttributeError):
        return {}
    return plan if isinstance(plan, dict) else {}


def _validate_folder(folder: Path, check: Any, out: Any, report_json: Path | None) -> None:
    """Every trial of a campaign folder (its trials/, else the folder's own JSON files): one row each,
    exit 1 when any is rejected."""
    from servetune.logs import emit_json, json_mode

    trials_dir = folder / "trials"
    files = sorted((trials_dir if trials_dir.is_dir() else folder).glob("*.json"))
    files = [f for f in files if f.name not in CAMPAIGN_FILES]
    if not files:
        Console(stderr=True).print(f"[red]validate:[/red] {escape(str(folder))}: no trial result in it"
                                   " (a campaign folder keeps them in trials/)", soft_wrap=True)
        raise typer.Exit(BAD_INPUT)
    checked = [check(f) for f in files]
    table = Table(title=f"{folder}: {sum(r.success for _, r in checked)} of {len(checked)} trials accepted")
    for col in ("trial", "stage", "level", "verdict", "rejected by"):
        table.add_column(col, no_wrap=col != "rejected by")
    for trial, report in checked:
        level = trial.load.get("rate") if trial.load.get("mode") == "rate" else trial.load.get("concurrency")
        failed = ", ".join(dict.fromkeys(o.checklist or o.suite for o in report.failed))
        why = "; ".join(report.plain()) + f" [dim]({failed})[/dim]" if failed else "-"
        table.add_row(trial.trial_id[:12], trial.stage or "bench", "-" if level is None else f"{level:g}",
                      "[green]ACCEPTED[/green]" if report.success else "[red]REJECTED[/red]", why)
    out.print(table)
    documents = [{"trial_id": t.trial_id, "accepted": r.success, "valid": t.summary.valid,
                  "invalid_reasons": t.summary.invalid_reasons, "report": r} for t, r in checked]
    if report_json:
        report_json.write_text(orjson.dumps([d | {"report": d["report"].model_dump(mode="json")}
                                             for d in documents], option=orjson.OPT_INDENT_2).decode())
    if json_mode():
        emit_json(documents)
    if not all(r.success for _, r in checked):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    @app.command("validate")
    def validate(
        result: Annotated[Path, typer.Argument(
            help="a trial result JSON, or a campaign folder (every trial in its trials/)")],
        min_measured: Annotated[int | None, typer.Option(
            "--min-measured", min=1, help="fewest measured requests a trial needs (default: a campaign folder's"
                                          " plan's validation.min_measured, else 200)")] = None,
        interval_ms: Annotated[float | None, typer.Option(
            "--interval-ms", help="expected GPU sampling interval (default: the one the trial recorded)")] = None,
        waive: Annotated[list[str] | None, typer.Option(
            "--waive", help="checklist item to waive (gpu_memory_curve, clean_gpu, energy)")] = None,
        data_docs: Annotated[Path | None, typer.Option(
            "--data-docs", help="build GX Data Docs into this folder")] = None,
        report_json: Annotated[Path | None, typer.Option(
            "--report-out", help="also write the ValidationReport (a folder: every trial's) to this JSON file")] = None,
        show_all: Annotated[bool, typer.Option("--all", help="list passing expectations too")] = False,
        min_window_s: Annotated[float | None, typer.Option(
            "--min-window-s", min=0, help="shortest steady window (default: the rule the trial was measured under)")]
        = None,
        min_completions: Annotated[int | None, typer.Option(
            "--min-completions", min=0, help="fewest completions in the window (default: the trial's rule)")] = None,
        json_out: JsonFlag = False,
    ) -> None:
        """Check RESULT against the report checklist (Great Expectations suites in expectations/)."""
        use_json(json_out)
        from servetune.logs import console, emit_json, json_mode, quiet_info
        from servetune.result import TrialResult
        from servetune.result_check import ResultError
        from servetune.validation import validate as run_checklist
        from servetune.validation.checklist import check_waivable, trial_rules

        quiet_info("servetune.validation")  # its one INFO line says what the verdict table says
        err = Console(stderr=True)
        out = console(stderr=json_mode())  # --json: the document alone on stdout
        overrides = {k: v for k, v in (("min_window_s", min_window_s), ("min_completions", min_completions))
                     if v is not None}

        plan = _folder_plan(result) if result.is_dir() else {}  # a campaign is judged as its plan asked
        needed = min_measured or (plan.get("validation") or {}).get("min_measured") or 200
        waive = [*(waive or ()), *((plan.get("validation") or {}).get("waive") or [])]

        def check(path: Path) -> tuple[TrialResult, Any]:
            """One trial file through the checklist; a file that cannot be judged is one line and exit 2."""
            try:
                trial = TrialResult.read(path)  # the check `servetune load` runs too: the same line for a bad file
                rules = trial_rules(trial).model_copy(update=overrides)
                return trial, run_checklist(trial, min_measured=needed, expected_interval_ms=interval_ms,
                                            waive=tuple(waive or ()), data_docs_dir=data_docs, rules=rules)
            except (ResultError, OSError, ValueError, KeyError) as exc:
                text = str(exc) if isinstance(exc, ResultError) else f"{path}: {exc}"
                err.print(f"[red]validate:[/red] {escape(text)}", soft_wrap=True)
                raise typer.Exit(BAD_INPUT) from None

        try:
            check_waivable(waive or ())  # before any file is read
        except ValueError as exc:
            err.print(f"[red]validate:[/red] {escape(str(exc))}", soft_wrap=True)
            raise typer.Exit(BAD_INPUT) from None
        if result.is_dir():
            _validate_folder(result, check, out, report_json)
            return
        trial, report = check(result)
        table = Table(title=f"trial {trial.trial_id}: {'ACCEPTED' if report.success else 'REJECTED'} "
                            f"(GX {report.gx_version})")
        for col in ("", "checklist", "expectation", "column", "observed"):
            table.add_column(col, no_wrap=col == "")
        for o in report.results:
            if o.success and not show_all:
                continue
            table.add_row("[green]ok[/green]" if o.success else "[red]FAIL[/red]", o.checklist or o.suite,
                          o.expectation.removeprefix("expect_"), o.column or "",
                          escape(_observed(o.observed_value))[:80])
        out.print(table)
        if not report.success:
            failed: dict[str, list[str]] = {}
            for o in report.failed:
                failed.setdefault(o.checklist or o.suite, []).append(o.column or o.expectation)
            out.print("rejected: " + "; ".join(report.plain()), soft_wrap=True, highlight=False)
            out.print("checklist items: " + "; ".join(f"{k} ({', '.join(dict.fromkeys(v))})"
                                                       for k, v in failed.items()), soft_wrap=True, highlight=False)
        s = trial.summary
        if s.valid is False:
            err.print(f"[red]INVALID[/red] (servetune.validity): {escape('; '.join(s.invalid_reasons))}",
                      soft_wrap=True, highlight=False)
        if report_json:
            report_json.write_text(report.model_dump_json(indent=2))
        if report.data_docs:
            out.print(f"Data Docs: {report.data_docs}", highlight=False, soft_wrap=True)
        if json_mode():
            emit_json({"trial_id": trial.trial_id, "accepted": report.success, "valid": s.valid,
                       "invalid_reasons": s.invalid_reasons, "report": report})
        if not report.success:
            raise typer.Exit(1)
