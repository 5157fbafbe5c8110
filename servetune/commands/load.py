"""``servetune load RESULT``: a campaign directory or a trial JSON into the warehouse; ``servetune accept
EXPERIMENT``: its answer as the baseline later runs are compared with (servetune.warehouse.acceptance)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from servetune.commands.db import BAD_INPUT, DatabaseUrl, warehouse_errors
from servetune.commands.jsonout import JsonFlag, use_json
from servetune.redact import redact_text


def _counts(report: Any) -> dict[str, Any]:
    """``load --json``: how many trials each action and status had, and every trial's line."""
    from collections import Counter

    return {"experiment_id": report.experiment_id, "trials": len(report.trials),
            "actions": dict(Counter(t.action for t in report.trials)),
            "statuses": dict(Counter(t.status for t in report.trials)),
            "request_rows": sum(t.rows.get("request_records", 0) for t in report.trials),
            "loaded": [{"trial_id": t.trial_id, "action": t.action, "status": t.status, "rows": t.rows,
                        "reason": redact_text(t.failure_reason) if t.failure_reason else None}
                       for t in report.trials],
            "errors": [redact_text(e) for e in report.errors]}


def register(app: typer.Typer) -> None:
    @app.command("load")
    def load(
        result: Annotated[Path, typer.Argument(help="a campaign directory (experiment.json + trials/) or "
                                               "a trial JSON (e.g. from `servetune bench`)")],
        database_url: DatabaseUrl = None,
        validate: Annotated[bool, typer.Option("--validate/--no-validate",
                                               help="run the report checklist before storing")] = True,
        replace: Annotated[bool, typer.Option("--replace", help="swap a stored trial whose content differs")] = False,
        min_measured: Annotated[int, typer.Option("--min-measured", min=1,
                                                  help="fewest measured requests a trial needs")] = 200,
        waive: Annotated[list[str] | None, typer.Option(
            "--waive", help="checklist item to waive (gpu_memory_curve, clean_gpu, energy),"
                            " e.g. for a CPU engine")] = None,
        json_out: JsonFlag = False,
    ) -> None:
        """Store every trial of RESULT: one transaction each; reloading the same trial changes nothing."""
        as_json = use_json(json_out)
        from servetune.ingest import load_result
        from servetune.logs import emit_json
        from servetune.validation.checklist import check_waivable

        try:
            check_waivable(waive or ())  # before the warehouse is touched
        except ValueError as exc:
            Console(stderr=True).print(f"[red]load:[/red] {escape(str(exc))}", soft_wrap=True)
            raise typer.Exit(BAD_INPUT) from None
        with warehouse_errors("load"):
            report = load_result(database_url, result, validate=validate, replace=replace,
                                 min_measured=min_measured, waive=tuple(waive or ()))
        table = Table(title=f"experiment {report.experiment_id}")
        for col in ("trial", "action", "status", "request rows", "reason"):
            table.add_column(col)
        for t in report.trials:
            style = {"ok": "green", "rejected": "yellow", "failed": "red"}.get(t.status, "")
            table.add_row(t.trial_id, t.action, f"[{style}]{t.status}[/{style}]" if style else t.status,
                          str(t.rows.get("request_records", "-")), escape(redact_text(t.failure_reason or "")))
        Console(stderr=as_json).print(table)  # --json: stdout holds the document alone
        if as_json:
            emit_json(_counts(report))
        err = Console(stderr=True)
        for e in report.errors:
            err.print(f"[red]load:[/red] {escape(redact_text(e))}", soft_wrap=True)
        if report.errors:
            raise typer.Exit(1)
        if report.accepted:
            err.print(f"accepted as the baseline: {escape(report.accepted)}", soft_wrap=True, highlight=False)

    @app.command("accept")
    def accept_cmd(
        experiment: Annotated[str, typer.Argument(help="the experiment id (or enough of its start to be unique)")],
        why: Annotated[str, typer.Option("--why", help="why this answer is the baseline now (kept, shown)")],
        by: Annotated[str | None, typer.Option("--by", help="who accepts (default: the login name)")] = None,
        database_url: DatabaseUrl = None,
        json_out: JsonFlag = False,
    ) -> None:
        """Accept a campaign's answer as the baseline later runs are compared with (a regressed or changed
        answer waits for this; until then later runs compare with the last accepted one)."""
        as_json = use_json(json_out)
        from servetune.logs import emit_json
        from servetune.warehouse.acceptance import accept

        with warehouse_errors("accept"):
            done = accept(experiment, why, by=by, database_url=database_url)
        if as_json:
            emit_json({"experiment_id": done.experiment_id, "model": done.model, "accepted_by": done.accepted_by,
                       "reason": done.reason})
        else:
            typer.echo(f"accepted {done.experiment_id} ({done.model}) as the baseline, by {done.accepted_by}:"
                       f" {done.reason}")
