"""``servetune bench``: one trial against a running endpoint: progress bar, summary tables, JSON result.

Everything is checked before the first request: a bad option, workload file, SLA or ``--out`` path,
or an unreachable URL ends with one line naming the cause and exit code 2, and nothing is sent.
SIGINT/SIGTERM during the trial write a partial result (the requests finished so far, status
failed, the reason saying so) and exit 130; a second signal exits 130 at once, writing nothing.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Annotated

import orjson
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from servetune.commands.bench_names import cli_names
from servetune.commands.jsonout import JsonFlag, use_json
from servetune.commands.outpath import check_out_file, write_result
from servetune.loadgen import TargetUnreachable
from servetune.numbers import check_bench_options, error_text
from servetune.redact import redact_text
from servetune.result import Percentiles, TrialResult, TrialSummary
from servetune.sla import SLA
from servetune.workload.spec import WorkloadSpec

DEFAULT_PRESET = "chat-default"
BAD_INPUT = 2
INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it

console = Console(stderr=True)


class BadInput(Exception):
    """A user error found before anything was sent: printed as one line, exit code 2."""


def _error(message: str) -> None:
    """One red line; a URL's password or a key in it is masked (servetune.redact)."""
    console.print("[red]error:[/red]", escape(redact_text(message)), highlight=False, soft_wrap=True)


def _pydantic_line(exc: ValidationError, prefix: str = "") -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"])
        msg = error_text(err)
        parts.append(f"{prefix}{loc}: {msg}" if loc else f"{prefix}{msg}".strip())
    return "; ".join(parts)


def _server_processes(pids: list[int] | None) -> list[int] | None:
    """The given PIDs and their children (an engine's workers hold the GPU too)."""
    if not pids:
        return None
    import psutil

    out: list[int] = []
    for pid in pids:
        try:
            out += [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
        except psutil.NoSuchProcess as exc:
            raise BadInput(f"--server-pid: no process {pid}") from exc
    return out


def resolve_workload(value: str | None) -> WorkloadSpec:
    """A workload file (YAML/JSON) or the name of a preset; the default preset when None."""
    from servetune.workload.presets import PRESETS, get_preset

    if value is None:
        return get_preset(DEFAULT_PRESET)
    path = Path(value)
    if path.exists():  # a FIFO or directory too: input_files says what it is
        try:
            return WorkloadSpec.from_file(path)
        except ValidationError as exc:
            raise BadInput(f"workload {value}: {_pydantic_line(exc)}") from exc
        except Exception as exc:  # noqa: BLE001 - YAML/JSON syntax, unreadable file
            raise BadInput(f"workload {value}: {_syntax_line(exc)}") from exc
    if value in PRESETS:
        return get_preset(value)
    raise BadInput(f"workload: {value!r} is neither a file nor a preset ({', '.join(sorted(PRESETS))})")


def _syntax_line(exc: Exception) -> str:
    """One line for a file that does not parse: which format, where, and what."""
    import yaml

    if isinstance(exc, yaml.YAMLError):
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        return f"not valid YAML{where}: {getattr(exc, 'problem', None) or exc}"
    if isinstance(exc, orjson.JSONDecodeError):
        return f"not valid JSON: {exc}"
    text = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
    return text.splitlines()[0]


def _log_file(path: Path | None) -> str | None:
    if path is None:
        return None
    if not path.is_file():
        raise BadInput(f"--server-log: {path} is not a file")
    return str(path)


def _gpu_list(value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        return [int(x) for x in value.split(",") if x.strip()]
    except ValueError as exc:
        raise BadInput(f"--gpus: expected comma-separated GPU indices like 0,1, got {value!r}") from exc


def _ms(p: Percentiles, field: str) -> str:
    v = getattr(p, field)
    return "-" if v is None else f"{v:.1f}"


def _num(v: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def summary_tables(result: TrialResult) -> list[Table]:
    """Latency percentiles, then throughput, goodput, cache and GPU figures."""
    s = result.summary
    lat = Table(title=f"trial {result.trial_id[:8]}  status={result.status}")
    lat.add_column("latency (ms)")
    for col in ("p50", "p90", "p99", "mean", "max"):
        lat.add_column(col, justify="right")
    for name, p in (("TTFT", s.ttft_ms), ("ITL", s.itl_ms), ("TPOT", s.tpot_ms), ("E2E", s.e2e_ms)):
        lat.add_row(name, *(_ms(p, f) for f in ("p50", "p90", "p99", "mean", "max")))

    figs = Table(show_header=True)
    figs.add_column("figure")
    figs.add_column("value", justify="right")
    good = f" ({s.goodput_fraction:.1%} good)" if s.goodput_fraction is not None else ""
    gpu = (
        f"{s.gpu_mem_peak_bytes / 2**30:.2f} GiB"
        if s.gpu_mem_peak_bytes is not None
        else f"- ({s.gpu_state})"
    )
    rows = [
        ("validity", validity_text(s)),
        ("requests ok / measured", f"{s.requests_ok} / {s.requests_measured} (errors {s.error_rate:.1%})"),
        ("window", f"{_num(s.window_s, '{:.2f}')} s ({s.window_source or '-'}),"
                   f" {s.completions_in_window} completed in it (needed {s.completions_needed})"),
        ("in flight", in_flight_text(s)),
        ("requests/s", _num(s.request_throughput, "{:.2f}")),
        ("output tokens/s", _num(s.output_tokens_per_s)),
        ("decode tokens/s", _num(s.decode_tokens_per_s)),
        ("input tokens/s", _num(s.input_tokens_per_s)),
        ("goodput req/s", _num(s.goodput_rps, "{:.2f}") + good),
        ("prefix hit rate (usage)", _num(s.prefix_hit_rate, "{:.1%}")),
        ("prefix hit rate (server)", _num(s.prefix_hit_rate_server, "{:.1%}")),
        ("GPU memory peak", gpu),
    ]
    if s.sched_prefill_batches is not None:
        rows.append(("scheduler log", f"{s.sched_prefill_batches} prefill / {s.sched_decode_lines} decode lines,"
                                      f" decode batch {_num(s.sched_decode_running_mean)},"
                                      f" queue max {s.sched_queue_max},"
                                      f" hit rate {_num(s.sched_cache_hit_rate, '{:.1%}')}"))
    if s.errors_by_class:
        rows.append(("errors", ", ".join(f"{k}={v}" for k, v in sorted(s.errors_by_class.items()))))
    for name, value in rows:
        figs.add_row(name, value)
    return [lat, figs]


def validity_text(s: TrialSummary) -> str:
    """VALID, or INVALID with every reason (servetune.validity)."""
    if s.valid is None:
        return "- (not assessed)"
    return "VALID" if s.valid else "INVALID: " + "; ".join(s.invalid_reasons)


def in_flight_text(s: TrialSummary) -> str:
    if s.in_flight_mean is None:
        return "-"
    text = f"mean {s.in_flight_mean:.1f}, lowest {s.in_flight_min or 0:.1f}"
    if s.in_flight_target:
        text += f" of {s.in_flight_target:.0f} streams"
    if s.dispatch_fraction is not None:
        text += f"; dispatched at {s.dispatch_fraction:.0%} of the schedule"
    if s.sustained is not None:
        text += ("; server kept up" if s.sustained
                 else f"; server fell behind ({s.completion_fraction or 0:.0%} completed)")
    return text


def bench(
    url: Annotated[str, typer.Option(help="server base URL, e.g. http://127.0.0.1:30000")],
    concurrency: Annotated[int, typer.Option(help="closed-loop streams; with --rate, the in-flight cap")],
    out: Annotated[Path, typer.Option(help="where to write the JSON result")],
    requests: Annotated[int | None, typer.Option(
        help="measured requests (warm-up not included); with a trace, default: its rows less the warm-up")] = None,
    workload: Annotated[str | None, typer.Option(help="workload file (YAML/JSON) or preset name")] = None,
    rate: Annotated[float | None, typer.Option(help="open loop: requests per second (a trace: rescaled to it)")] = None,
    arrival: Annotated[str | None, typer.Option(
        help="constant | poisson | gamma (with --rate) | trace (default with a trace)")] = None,
    trace: Annotated[Path | None, typer.Option(help="JSONL timed trace to replay as an open loop (docs/workload.md)")]
    = None,
    trace_speed: Annotated[float | None, typer.Option(help="with --trace: 2 replays twice as fast")] = None,
    burstiness: Annotated[float, typer.Option(help="gamma shape: <1 burstier, >1 smoother")] = 1.0,
    exact_rate: Annotated[bool, typer.Option(
        "--exact-rate/--sampled-rate", help="with --rate: stretch the drawn gaps so the measured arrivals offer"
                                            " exactly that rate, their burstiness kept (default); --sampled-rate"
                                            " keeps the draw (a seed's draw can offer 5% more or less)")] = True,
    waves: Annotated[int | None, typer.Option(
        "--waves", min=1, help="static batching: send B requests, wait for all, send the next B (instead of"
                               " --concurrency streams; docs/diagnoses.md)")] = None,
    endpoint: Annotated[str, typer.Option(help="chat | completions | generate")] = "chat",
    model: Annotated[str | None, typer.Option(help="model name sent in the request body")] = None,
    sla: Annotated[
        list[str] | None, typer.Option(help="per-request bound, e.g. ttft_ms=500 (repeat)")
    ] = None,
    warmup: Annotated[int, typer.Option(help="warm-up requests before the measured ones")] = 1,
    prime: Annotated[bool, typer.Option(help="before the warm-up, one short request per shared system prompt and"
                                             " pooled image the measured requests use (a warm prefix cache)")] = True,
    tokenizer: Annotated[
        str | None, typer.Option(help="tokenizer.json or model dir: exact prompt lengths")
    ] = None,
    api_key_env: Annotated[
        str, typer.Option(help="NAME of the env var holding the API key")
    ] = "SERVETUNE_API_KEY",
    gpu_interval_ms: Annotated[float, typer.Option(help="NVML sampling interval")] = 100.0,
    gpus: Annotated[str | None, typer.Option(help="GPU indices to sample, e.g. 0,1 (default: all)")] = None,
    server_pid: Annotated[list[int] | None, typer.Option(
        help="PID of the server's own processes (repeatable): they do not make the GPU 'dirty'")] = None,
    flush_cache: Annotated[bool, typer.Option(help="POST /flush_cache before the warm-up")] = True,
    timeout_s: Annotated[float, typer.Option(help="per-request timeout, stream included")] = 600.0,
    idle_timeout: Annotated[float, typer.Option(
        "--idle-timeout", help="fail a request whose stream sends no byte for this many seconds (0: off)")
    ] = 60.0,
    seed: Annotated[int | None, typer.Option(help="override the workload's seed")] = None,
    server_log: Annotated[Path | None, typer.Option(
        help="the engine's log file (SGLang): its scheduler batch lines during the trial are kept")] = None,
    min_window_s: Annotated[float, typer.Option(help="validity: shortest steady window, seconds")] = 20.0,
    min_completions: Annotated[int, typer.Option(
        help="validity: fewest completions in the window (and >= 4 per stream)")] = 200,
    workers: Annotated[int | None, typer.Option(
        min=1, help="client processes the streams are split over (default: one per 256 streams, up to the cores"
                    " but one)")] = None,
    http_client: Annotated[str, typer.Option(
        help="auto (the raw HTTP/1.1 client for http://, aiohttp for https://), raw or aiohttp")] = "auto",
    read_batch_ms: Annotated[float, typer.Option(
        help="raw client: read the sockets at most once per this many ms (kernel-stamped, so the stamps stay"
             " exact; a request a stream's end lets out waits up to this long; 0: read at once)")] = 1.0,
    json_out: JsonFlag = False,
) -> None:
    """Benchmark a running endpoint: one trial, its summary, and a JSON result with every record."""
    use_json(json_out)
    from servetune.commands.trace import bench_trace
    from servetune.trial import Interrupt, TrialRequest, run_trial

    interrupt = Interrupt()
    try:
        check_bench_options(locals())  # finite numbers within servetune's limits, before anything else
        out = check_out_file(out)  # a symlink's target: the link is written through
        spec = resolve_workload(workload)
        if seed is not None:
            spec = spec.model_copy(update={"seed": seed})
        spec, arrival, requests = bench_trace(spec, trace, trace_speed, arrival, requests, warmup)
        if waves is not None and (rate is not None or arrival == "trace"):
            raise BadInput("--waves: waves have no arrival schedule; leave out --rate and --trace")
        try:
            sla_obj = SLA.parse_cli(sla) if sla else None
        except ValidationError as exc:
            raise BadInput(_pydantic_line(exc, "--sla ")) from exc
        except ValueError as exc:
            raise BadInput(f"--sla: {exc}") from exc
        try:
            req = TrialRequest.model_validate(
                {
                    "target": {
                        "url": url,
                        "endpoint": endpoint,
                        "model": model,
                        "api_key_env": api_key_env,
                        "timeout_s": timeout_s,
                        "idle_timeout_s": idle_timeout or None,
                        "http_client": http_client,
                        "read_batch_ms": read_batch_ms,
                    },
                    "load": {
                        "mode": "rate" if rate is not None or arrival == "trace" else
                        "waves" if waves is not None else "concurrency",
                        "concurrency": waves if waves is not None and rate is None else concurrency,
                        "rate": rate,
                        "arrival": arrival,
                        "burstiness": burstiness,
                        "exact_rate": exact_rate and rate is not None and arrival != "trace",
                        "warmup_requests": warmup,
                        "prime_cache": prime,
                        "seed": spec.seed,
                    },
                    "workload": spec,
                    "num_requests": requests,
                    "sla": sla_obj,
                    "gpu_indices": _gpu_list(gpus),
                    "server_pids": _server_processes(server_pid),
                    "gpu_interval_ms": gpu_interval_ms,
                    "flush_cache": flush_cache,
                    "tokenizer": tokenizer,
                    "validity": {"min_window_s": min_window_s, "min_completions": min_completions},
                    "server_log": _log_file(server_log),
                    "client_workers": workers,
                }
            )
        except ValidationError as exc:
            raise BadInput(cli_names(_pydantic_line(exc))) from exc
        result = _run_with_progress(run_trial, req, interrupt)
    except (BadInput, TargetUnreachable, ValueError) as exc:
        # ValueError: from building the workload (e.g. a length the tokenizer cannot reach)
        _error(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        raise typer.Exit(BAD_INPUT) from None
    except (KeyboardInterrupt, asyncio.CancelledError):  # a signal before the load, or a second one
        _error(f"interrupted{f' by {interrupt.name} twice' if interrupt.name else ''}: no result written")
        raise typer.Exit(INTERRUPTED) from None

    path, unwritten = write_result(result, out)  # a full disk: kept in the temp folder instead, said below
    from servetune.logs import emit_json, json_mode
    for table in summary_tables(result):
        (console if json_mode() else Console()).print(table)  # --json: stdout holds the document alone
    if json_mode():
        emit_json({"trial_id": result.trial_id, "status": result.status,
                   "failure_reason": result.failure_reason and redact_text(result.failure_reason),
                   "result": str(path), "summary": result.summary})
    console.print(f"result written to {path}")
    if unwritten:
        _error(unwritten)
        raise typer.Exit(1)
    if interrupt.received is not None:
        why = (result.failure_reason if result.status != "ok"
               else f"interrupted by {interrupt.name} after the load had finished: the result is complete")
        console.print(f"[yellow]{escape(redact_text(why or 'interrupted'))}[/yellow]", highlight=False,
                      soft_wrap=True)
        raise typer.Exit(INTERRUPTED)
    if result.summary.valid is False:
        console.print("[yellow]INVALID trial[/yellow] (it decides nothing):",
                      escape("; ".join(result.summary.invalid_reasons)), highlight=False, soft_wrap=True)
    if result.status != "ok":
        console.print("[red]trial failed:[/red]", escape(redact_text(result.failure_reason or "?")), highlight=False,
                      soft_wrap=True)
        raise typer.Exit(1)


def _run_with_progress(run_trial, req, interrupt) -> TrialResult:  # noqa: ANN001 - keeps the import lazy
    total = req.total_requests
    start = time.perf_counter()
    with Progress(
        TextColumn("[bold]bench"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[tps]:>8.0f} tok/s"),
        TextColumn("errors {task.fields[errors]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as bar:
        task = bar.add_task("requests", total=total, tps=0.0, errors=0)

        def progress(done: int, errors: int, tokens: int) -> None:
            elapsed = time.perf_counter() - start
            bar.update(task, completed=done, errors=errors, tps=tokens / elapsed if elapsed > 0 else 0.0)

        return run_trial(req, progress=progress, interrupt=interrupt)


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
