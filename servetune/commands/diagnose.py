"""``servetune diagnose RESULT|DIR``: the diagnoses of one trial or of a campaign (docs/diagnoses.md).

A table per trial (severity, kind, what was seen, what to try) and the input-length buckets; ``--json``
prints the findings as one JSON array instead (the warehouse's ``diagnoses`` rows hold the same)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

BAD_INPUT = 2
STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}

console = Console(stderr=True)


def _tables(findings) -> list[Table]:  # noqa: ANN001 - list[Finding], imported lazily
    tables = []
    for tid in dict.fromkeys(f.trial_id for f in findings):
        t = Table(title=f"diagnoses of trial {tid}", show_lines=True, title_justify="left")
        for col in ("severity", "kind", "finding", "advice"):
            t.add_column(col, overflow="fold")
        for f in (f for f in findings if f.trial_id == tid):
            t.add_row(f"[{STYLE[f.severity]}]{f.severity}[/]", f.kind, escape(f.summary), escape(f.advice or "-"))
        tables.append(t)
        for f in findings:
            if f.trial_id == tid and f.kind == "interference.by_input_length":
                b = Table(title="by input length (prompt tokens)", title_justify="left")
                for col in ("bucket", "requests", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms",
                            "TPOT p50 ms", "TPOT p99 ms"):
                    b.add_column(col, justify="right")
                for row in f.evidence.get("buckets") or []:
                    b.add_row(*(str("-" if row[k] is None else row[k]) for k in (
                        "bucket", "requests", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms",
                        "tpot_p50_ms", "tpot_p99_ms")))
                tables.append(b)
    return tables


def register(app: typer.Typer) -> None:
    @app.command("diagnose")
    def diagnose(
        source: Annotated[Path, typer.Argument(help="a trial result JSON, or a campaign result directory",
                                               metavar="RESULT_OR_DIR")],
        as_json: Annotated[bool, typer.Option("--json", help="print the findings as a JSON array")] = False,
    ) -> None:
        """Diagnose a trial or a campaign: the GPU memory curve's shape, long-prompt interference, the
        prefix-cache audit, the queue against the memory reserve, and waves against continuous batching."""
        import orjson

        from servetune.diagnose import diagnose_dir
        from servetune.result_check import ResultError

        try:
            findings = diagnose_dir(source)
        except (FileNotFoundError, ResultError) as exc:
            console.print(f"[red]diagnose:[/red] {escape(str(exc))}", soft_wrap=True)
            raise typer.Exit(BAD_INPUT) from None
        if as_json:
            typer.echo(orjson.dumps([f.model_dump(mode="json") for f in findings],
                                    option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode())
            return
        out = Console()
        for table in _tables(findings):
            out.print(table)
        counts = {s: sum(f.severity == s for f in findings) for s in ("critical", "warning", "info")}
        out.print(f"{len(findings)} findings: {counts['critical']} critical, {counts['warning']} warning,"
                  f" {counts['info']} info")
