"""``servetune diagnose RESULT|DIR``: the diagnoses of one trial or of a campaign (docs/diagnoses.md).

A campaign folder first gets its summary on one screen (servetune.diagnose.summary: a row per trial in
stage and level order, the findings counted, the ones worth acting on with what to try), then the detail
of the trials with a critical or warning finding; ``--all`` gives every trial's, ``--trial ID`` one
trial's. Each detail names the requests its figures cover. ``--json`` (or ``servetune --json diagnose``)
prints the findings as one JSON array instead (the warehouse's ``diagnoses`` rows hold the same)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from servetune.commands.jsonout import JsonFlag, use_json

if TYPE_CHECKING:
    from servetune.diagnose import Finding
    from servetune.diagnose.summary import CampaignSummary
    from servetune.result import TrialResult

BAD_INPUT = 2
DETAIL_MAX = 3  # by default, the detail of the most serious trials only (criticals first)
STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
STATUS_STYLE = {"accepted": "green", "passed": "green", "rejected": "red", "failed": "bold red", "INVALID": "red"}
BUCKET_COLUMNS = ("bucket", "req", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "TPOT p50", "TPOT p99")
BUCKET_KEYS = ("bucket", "requests", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "tpot_p50_ms",
               "tpot_p99_ms")

console = Console(stderr=True)


def _sev(sev: str, text: str | None = None) -> str:
    return f"[{STYLE[sev]}]{escape(text or sev)}[/]"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def _fit(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters (an ellipsis marks the cut), padded to it."""
    return (text if len(text) <= width else text[: max(width - 1, 0)] + "…").ljust(width)


def _widths(wanted: list[int], flexible: tuple[int, ...], room: int) -> list[int]:
    """Column widths within ``room``: the fixed ones as wanted, the flexible ones cut in their order, each to 10
    characters at least (the config before the finding)."""
    widths = list(wanted)
    for i in flexible:
        widths[i] -= min(max(sum(widths) - room, 0), max(widths[i] - 10, 0))
    return widths


def _goodput(x: float | None, evidence: bool) -> str:
    return "-" if x is None else f"{x:.2f}" if evidence else f"({x:.2f})"


def table_lines(s: CampaignSummary, width: int) -> list[str]:
    """The rows, one line each whatever the terminal's width (the config and the finding are cut to fit)."""
    head = ["trial" if not s.grouped else "trials", "stage", "load", "config", "status", "goodput", "worst finding"]
    cells = [[r.trial_ids[0][:8] if len(r.trial_ids) == 1 else f"{len(r.trial_ids)} trials", r.stage, r.load, r.config,
              r.status, _goodput(r.goodput_rps, r.evidence) + ("*" if r.recommended else " "),
              "-" if r.worst is None else f"{r.worst.severity} {r.worst.kind}"] for r in s.rows]
    wanted = [max(len(c[i]) for c in [head, *cells]) for i in range(len(head))]
    widths = _widths(wanted, (3, 6), width - 2 * (len(head) - 1))
    out = ["[bold]" + "  ".join(_fit(h, w) for h, w in zip(head, widths, strict=True)).rstrip() + "[/]"]
    for r, c in zip(s.rows, cells, strict=True):
        parts = [escape(_fit(x, w)) if i != 5 else x.rjust(w) for i, (x, w) in enumerate(zip(c, widths, strict=True))]
        first = r.status.split(" ")[-1] if s.grouped else r.status
        parts[4] = f"[{STATUS_STYLE.get(first, 'default')}]{parts[4]}[/]"
        if r.worst is not None:
            parts[6] = f"[{STYLE[r.worst.severity]}]{parts[6].rstrip()}[/]"
        out.append("  ".join(parts).rstrip())
    return out


def _cut(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: max(chars - 1, 0)].rstrip() + "…"


def summary_lines(s: CampaignSummary, width: int = 80) -> list[str]:
    """The one-screen campaign summary: markup lines in print order, each at most ``width`` wide but the
    legend, the counts and the advice (wrapped, the advice cut at two lines)."""
    statuses = ", ".join(f"{n} {k}" for k, n in sorted(s.statuses.items(), key=lambda kv: -kv[1]))
    out = [f"[bold]{escape(s.title)}[/]", f"{sum(s.statuses.values())} trials: {statuses}"]
    if s.recommendation:
        out.append(f"recommended (*): {escape(s.recommendation)}")
    out += table_lines(s, width)
    out.append("[dim]load: streams unless named; goodput: req/s within the SLA over the requests completed in the"
               " steady window" + (" (a group's mean)" if s.grouped else "") + "; (x): no evidence, not accepted;"
               " '-': info only[/]")
    out += [f"  {escape(_cut(n, 2 * width - 12))}" for n in s.notes]
    counts = {sev: sum(k.values()) for sev, k in s.counts.items()}
    out += ["", "findings: " + ", ".join(_sev(sev, f"{n} {sev}") for sev, n in counts.items())]
    out += [f"  {_sev(sev)}: " + ", ".join(f"{escape(k)} {n}" for k, n in kinds.items())
            for sev, kinds in s.counts.items() if kinds]
    if s.top:
        out += ["", "to act on, most severe first (one example each; its detail: --trial ID):"]
        for t in s.top:
            out.append(f"  {_sev(t.severity)} [bold]{escape(t.kind)}[/] in {t.trials} trial{'s' * (t.trials > 1)},"
                       f" e.g. {escape(t.where)}")
            out.append(f"    {escape(_cut(t.example.summary, width - 4))}")
            if t.example.advice:
                out.append(f"    [bold]try:[/] {escape(_cut(t.example.advice, 2 * (width - 4) - 10))}")
        if s.more:
            out.append(f"  [dim]also: {escape(', '.join(s.more))}[/]")
    return out


def _bucket_table(f: Finding) -> list[Any]:
    ev = f.evidence
    named = ev.get("request_set") or "all successful measured requests (warm-up left out)"
    t = Table(title=f"by input length (prompt tokens; latencies in ms), over {escape(named)}", title_justify="left",
              box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True)
    for col in BUCKET_COLUMNS:
        t.add_column(col, justify="right", no_wrap=True)
    rows = [*(ev.get("buckets") or []), *([ev["whole_run"]] if ev.get("whole_run") else [])]
    for row in rows:
        cells = [str(row.get(k)) if k in ("bucket", "requests") else _ms(row.get(k)) for k in BUCKET_KEYS]
        if row is ev.get("whole_run"):
            cells[0] = "whole run*"
        t.add_row(*cells, style="dim" if row is ev.get("whole_run") else None)
    out: list[Any] = [t]
    if ev.get("whole_run"):
        out.append(f"  [dim]* {escape(ev.get('whole_run_set') or 'the whole run')}: start-up burst and drain"
                   " included, so not comparable with the rows above or the summary[/]")
    return out


def trial_detail(t: TrialResult, findings: list[Finding], config: str, status: str) -> list[Any]:
    """One trial: a header line, the request set its summary figures cover, its findings, its buckets."""
    from servetune.diagnose import steady_set
    from servetune.diagnose.summary import load_label

    s = t.summary
    good = "" if s.goodput_rps is None else f" · goodput {s.goodput_rps:.2f} req/s"
    load = load_label(t)
    out: list[Any] = ["", f"[bold]── trial {t.trial_id}[/] · {escape(t.stage or 'bench')}"
                          f" · {load + ' streams' if load.isdigit() else load}"
                          f" · {escape(config)} · [{STATUS_STYLE.get(status, '')}]{status}[/]{good}"]
    if t.records:
        _, named = steady_set(t)
        out.append(f"  summary figures over {escape(named)}: TTFT p50 {_ms(s.ttft_ms.p50)} / p99 {_ms(s.ttft_ms.p99)}"
                   f" ms, TPOT p99 {_ms(s.tpot_ms.p99)} ms, E2E p99 {_ms(s.e2e_ms.p99)} ms")
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("severity", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    table.add_column("finding (-> what to try)", overflow="fold")
    for f in findings:
        text = escape(f.summary) + (f"\n[bold]-> try:[/] {escape(f.advice)}" if f.advice else "")
        table.add_row(_sev(f.severity), f.kind, text)
    out.append(table)
    for f in findings:
        if f.kind == "interference.by_input_length":
            out += _bucket_table(f)
    return out


def _serious(trials: list[TrialResult], findings: list[Finding]) -> list[str]:
    """The trials with a critical or warning finding, the criticals first, each group in campaign order."""
    order = {"critical": 0, "warning": 1}
    rank: dict[str, int] = {}
    for f in findings:
        if f.severity in order:
            rank[f.trial_id] = min(rank.get(f.trial_id, 9), order[f.severity])
    pos = {t.trial_id: i for i, t in enumerate(trials)}
    return sorted(rank, key=lambda tid: (rank[tid], pos.get(tid, len(pos))))


def _campaign_files(folder: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """experiment.json and recommendation.json, {} / None where missing or unreadable (the summary does without)."""
    try:
        experiment = dict(folder.read_experiment()) if folder.has_experiment() else {}
    except (OSError, TypeError, ValueError):
        experiment = {}
    try:
        recommendation = folder.read_recommendation()
    except (OSError, ValueError):
        recommendation = None
    return experiment, recommendation if isinstance(recommendation, dict) else None


def _pick(trials: list[TrialResult], wanted: str) -> TrialResult:
    hits = [t for t in trials if t.trial_id.startswith(wanted)]
    if len(hits) != 1:
        why = "no trial" if not hits else f"{len(hits)} trials"
        console.print(f"[red]diagnose:[/red] {why} whose id starts with {escape(wanted)!r}", soft_wrap=True)
        raise typer.Exit(BAD_INPUT)
    return hits[0]


def register(app: typer.Typer) -> None:
    @app.command("diagnose")
    def diagnose(
        source: Annotated[Path, typer.Argument(help="a trial result JSON, or a campaign result directory",
                                               metavar="RESULT_OR_DIR")],
        show_all: Annotated[bool, typer.Option("--all", help="after the summary, every trial's findings and"
                                               " buckets (default: only trials with a critical or warning)")] = False,
        trial: Annotated[str | None, typer.Option("--trial", metavar="ID",
                                                  help="only this trial's findings (an id or its first characters)")]
        = None,
        json_out: JsonFlag = False,
    ) -> None:
        """Diagnose a trial or a campaign: the GPU memory curve's shape, long-prompt interference, the
        prefix-cache audit, the queue against the memory reserve, and waves against continuous batching.
        A campaign folder gets a one-screen summary first."""
        from servetune.diagnose import diagnose_trials, read_trials
        from servetune.diagnose.summary import config_labels, ordered, status, summarize
        from servetune.experiment import ResultFolder
        from servetune.logs import console as make_console, emit_json
        from servetune.result_check import ResultError

        try:
            trials = ordered(read_trials(source))
            findings = diagnose_trials(trials)
        except (FileNotFoundError, ResultError) as exc:
            console.print(f"[red]diagnose:[/red] {escape(str(exc))}", soft_wrap=True)
            raise typer.Exit(BAD_INPUT) from None
        chosen = [_pick(trials, trial)] if trial else trials
        ids = {t.trial_id for t in chosen}
        if use_json(json_out):
            emit_json([f.model_dump(mode="json") for f in findings if f.trial_id in ids])
            return
        out = make_console()  # stdout; a pipe gets 120 columns
        campaign = source.is_dir() and not trial
        if campaign:
            experiment, recommendation = _campaign_files(ResultFolder(source))
            summary = summarize(trials, findings, experiment=experiment, recommendation=recommendation)
            for line in summary_lines(summary, out.width):
                out.print(line, overflow="fold")
        shown, serious = chosen, _serious(trials, findings)
        if campaign and not show_all:  # the most serious few, in campaign order
            shown = [t for t in trials if t.trial_id in serious[:DETAIL_MAX]]
        labels = config_labels(trials)
        for t in shown:
            for part in trial_detail(t, [f for f in findings if f.trial_id == t.trial_id], labels[t.trial_id],
                                     status(t)):
                out.print(part)
        if campaign and not show_all:
            lead = ("no critical or warning finding" if not serious else
                    "above: the trials with a critical or warning finding" if len(shown) == len(serious) else
                    f"above: the {len(shown)} most serious of the {len(serious)} trials with a critical or warning")
            out.print(f"\n[dim]{lead}; details: --all (every trial), --trial ID (one)[/]")
        elif not campaign:
            kept = [f for f in findings if f.trial_id in ids]
            counts = {s: sum(f.severity == s for f in kept) for s in ("critical", "warning", "info")}
            out.print(f"{len(kept)} findings: {counts['critical']} critical, {counts['warning']} warning,"
                      f" {counts['info']} info")
