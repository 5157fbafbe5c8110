"""``servetune report``: an HTML report (with PNGs) of a campaign or of a single bench result.

The output folder is checked before anything is read (``--out``) or drawn (the default beside the
data): one line and exit 2 if it cannot be written."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from servetune.commands.db import DatabaseUrl, warehouse_errors
from servetune.commands.jsonout import JsonFlag, use_json
from servetune.commands.outpath import OutPathError, check_out_dir

BAD_INPUT = 2

console = Console(stderr=True)


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report(
        source: Annotated[str, typer.Argument(
            help="a campaign result directory, a trial or experiment JSON file, or an experiment id in the warehouse",
            metavar="EXPERIMENT_ID_OR_RESULT_DIR_OR_JSON")],
        out: Annotated[Path | None, typer.Option(
            "--out", help="folder for report.html and the PNGs (default: DIR/report, FILE-report/, ./report-ID)")]
        = None,
        database_url: DatabaseUrl = None,
        json_out: JsonFlag = False,
    ) -> None:
        """Write a self-contained HTML report: curves vs concurrency, GPU memory, hit rate, refinement heatmap,
        the recommendation and its difference from the last one, and every trial's checklist status."""
        as_json = use_json(json_out)
        from servetune.logs import emit_json
        from servetune.report.campaign import ReportInputError
        from servetune.report.html import default_out_dir, write_report
        from servetune.report.sources import load_campaign

        try:
            if out is not None:
                check_out_dir(out)
            with warehouse_errors("report", database_url):  # an experiment id is read from the warehouse
                campaign = load_campaign(source, database_url=database_url)
            if not campaign.trials:
                raise ReportInputError(f"{source}: no trials to report on")
            target = out or check_out_dir(default_out_dir(source, campaign), "report folder")
        except (ReportInputError, OutPathError) as exc:
            console.print(f"[red]report:[/red] {escape(str(exc))}", soft_wrap=True)
            raise typer.Exit(BAD_INPUT) from None
        rendered = write_report(campaign, target)
        for fig in rendered.figures:
            if fig.png is None:
                console.print(f"[yellow]not drawn[/yellow] {fig.title}: {escape(fig.note)}", soft_wrap=True)
        console.print(f"{len(campaign.trials)} trials, {len(rendered.png_paths)} figures")
        if as_json:
            emit_json({"report": str(rendered.html_path), "trials": len(campaign.trials),
                       "figures": [str(p) for p in rendered.png_paths],
                       "not_drawn": [fig.title for fig in rendered.figures if fig.png is None]})
            return
        typer.echo(str(rendered.html_path))
