"""``servetune trace convert``: a public request trace (Azure, Mooncake) as servetune's timed trace JSONL.

The logic is servetune.workload.trace_convert; this only parses options and prints one line, good or bad.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from servetune.commands.jsonout import JsonFlag, use_json
from servetune.workload.spec import WorkloadSpec
from servetune.workload.trace import TraceReplay, TraceSchedule

BAD_INPUT = 2

trace_app = typer.Typer(
    name="trace",
    help="Timed traces for replay (servetune bench --trace, workload.trace): convert public ones (docs/workload.md).",
    no_args_is_help=True,
)
console = Console(stderr=True)


@trace_app.command("convert")
def convert(
    src: Annotated[Path, typer.Argument(help="the source trace (Azure CSV or Mooncake JSONL)", metavar="IN")],
    dst: Annotated[Path, typer.Argument(help="the JSONL trace to write", metavar="OUT")],
    source: Annotated[str, typer.Option("--from", help="azure | mooncake")],
    limit: Annotated[int | None, typer.Option(help="keep at most this many requests (after the window)")] = None,
    start_s: Annotated[float, typer.Option(help="window start, seconds after the source's first request")] = 0.0,
    duration_s: Annotated[float | None, typer.Option(help="window length in seconds (default: to the end)")] = None,
    json_out: JsonFlag = False,
) -> None:
    """Convert IN (``--from azure|mooncake``) into OUT: arrival_s from the window's start, token lengths,
    and Mooncake's first hash id as prefix_group."""
    as_json = use_json(json_out)
    from servetune.logs import emit_json
    from servetune.workload.trace_convert import convert as run

    try:
        done = run(source, src, dst, limit=limit, start_s=start_s, duration_s=duration_s)
    except (ValueError, OSError) as exc:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        console.print(f"[red]error:[/red] {escape(text)}", highlight=False, soft_wrap=True)
        raise typer.Exit(BAD_INPUT) from None
    console.print(escape(done.text(dst)), highlight=False, soft_wrap=True)
    if as_json:
        emit_json({"out": str(dst), "rows": done.rows, "read": done.read, "span_s": done.span_s,
                   "raised_to_one": done.raised_to_one})


def bench_trace(spec: WorkloadSpec, trace: Path | None, speed: float | None, arrival: str | None,
                requests: int | None, warmup: int) -> tuple[WorkloadSpec, str, int]:
    """``servetune bench``'s trace options: the workload with ``--trace``/``--trace-speed``, the arrivals (the
    trace's own unless --arrival says) and the request count (default: the trace once, its first rows the warm-up).
    Bad input is a ValueError of one line, raised before anything is sent."""
    if trace is not None or speed is not None:
        if trace is None and spec.trace is None:
            raise ValueError("--trace-speed: needs --trace FILE (or a workload with a trace section)")
        base = spec.trace.model_dump() if spec.trace is not None else {}
        fields = {"path": str(trace) if trace is not None else base["path"]}
        if speed is not None:
            fields["speed"] = speed
        try:
            spec = spec.model_copy(update={"trace": TraceReplay.model_validate({**base, **fields})})
        except ValidationError as exc:
            fields = "; ".join(f"--trace-{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise ValueError(fields) from None
    arrival = arrival or ("trace" if spec.trace is not None else "poisson")
    if arrival == "trace" and spec.trace is None:
        raise ValueError("--arrival trace: needs --trace FILE (or a workload with a trace section)")
    if spec.trace is None:
        if requests is None:
            raise ValueError("--requests: required (only a trace gives the count: --trace FILE)")
        return spec, arrival, requests
    rows = len(TraceSchedule(spec.trace))  # a missing or bad file: TraceError, one line
    if requests is None and rows <= warmup:
        raise ValueError(f"--warmup: {warmup} warm-up requests leave none of the trace's {rows} rows to measure")
    requests = rows - warmup if requests is None else requests
    if warmup + requests > rows and not spec.trace.loop:
        raise ValueError(f"--requests: {warmup} warm-up + {requests} requests ask more than the trace's {rows} rows"
                         " (set trace.loop: true in a workload file to repeat it)")
    return spec, arrival, requests


def register(app: typer.Typer) -> None:
    app.add_typer(trace_app, name="trace")
