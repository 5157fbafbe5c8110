"""What the demo prints for one finished campaign: the verdict first, then the evidence tables.

The verdict lines are the report's (servetune.report.verdict); the protocols table is the report's
"Protocols side by side"; the recommendation table names the flags or "engine defaults" and the level,
with the figures as means over the repeats, as the report's key figures give them.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from servetune.experiment import ResultFolder


def trial_counts(warehouse_url: str, experiment_id: str) -> Any:
    """The experiment's trials in the warehouse: (accepted, rejected, all)."""
    from sqlalchemy import text

    from servetune.warehouse.db import engine

    with engine(warehouse_url).connect() as conn:
        return conn.execute(text(
            "select count(*) filter (where status = 'ok'), count(*) filter (where status = 'rejected'),"
            " count(*) from trials where experiment_id = :e"), {"e": experiment_id}).one()


def _verdict(campaign: Any) -> list[str]:
    from servetune.report.protocols import protocol_trials
    from servetune.report.verdict import verdict_lines

    return verdict_lines(campaign, protocol_trials(campaign))


def _campaign(folder: ResultFolder) -> Any:
    from servetune.report.sources import load_campaign

    return load_campaign(str(folder.path))


def outcome_document(folder: ResultFolder, warehouse_url: str) -> dict[str, Any]:
    """``demo --json``: one experiment's outcome, its verdict lines first (the recommendation's secrets masked)."""
    from servetune.redact import redact

    exp, rec, report = folder.read_experiment(), folder.read_recommendation(), folder.report_file
    accepted, rejected, total = trial_counts(warehouse_url, exp["experiment_id"])
    return {"experiment_id": exp["experiment_id"], "model": exp.get("model"), "status": exp.get("status"),
            "verdict": _verdict(_campaign(folder)), "folder": str(folder.path),
            "report": str(report) if report.exists() else None, "recommendation": redact(rec) if rec else None,
            "warehouse_trials": {"accepted": accepted, "rejected": rejected, "all": total}}


def print_outcome(console: Console, folder: ResultFolder, warehouse_url: str) -> None:
    """The verdict, the protocols side by side, the recommendation, the warehouse counts, the report path."""
    exp, rec, campaign = folder.read_experiment(), folder.read_recommendation(), _campaign(folder)
    console.print("[bold]Verdict[/]")
    for line in _verdict(campaign):  # the trials are read once, for the verdict and the protocols both
        console.print(f"  {escape(line)}", highlight=False, soft_wrap=True)
    print_protocols(console, campaign)
    counts = trial_counts(warehouse_url, exp["experiment_id"])
    t = Table(title=f"experiment {exp['experiment_id']} ({exp.get('model')}, status {exp.get('status')})")
    t.add_column("what")
    t.add_column("value")
    for what, value in recommendation_rows(rec):
        t.add_row(what, value)
    t.add_row("warehouse trials (accepted / rejected / all)", f"{counts[0]} / {counts[1]} / {counts[2]}")
    console.print(t)
    report = folder.report_file
    console.print(f"report: {report}" if report.exists() else "report: not written", soft_wrap=True)


def recommendation_rows(rec: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The recommendation as (what, value) rows: flags as typed or "engine defaults", the level, the figures."""
    if not rec:
        return [("recommendation", "none: no config met the SLA (see experiment.json)")]
    from servetune.engines.catalog import command_text  # as a user types them: a switch is a bare flag

    config = {k: True if v is None else v for k, v in (rec.get("config") or {}).items()}
    rows = [("recommended flags", command_text(config) if config else "engine defaults: no flag changed")]
    if rec.get("rate") is not None:
        rows.append(("capacity at the SLA", f"{rec['rate']:g} req/s (about {rec['concurrency']} in flight)"))
    else:
        rows.append(("recommended level", f"{rec['concurrency']} concurrent streams"))
    n = rec.get("repeats") or 1
    ci = rec.get("goodput_ci95")
    rows.append(("goodput (req/s at the SLA)", f"{rec.get('goodput_rps') or 0:.2f}"
                 + (f" ± {ci:.2f} (95% CI)" if isinstance(ci, float) else "") + f", mean of {n} seed(s)"))
    for what, key, fmt in (("output tokens/s", "output_tokens_per_s", "{:,.0f}"),
                           ("p99 TTFT ms", "p99_ttft_ms", "{:,.0f}"),
                           ("p99 TPOT ms", "p99_tpot_ms", "{:.1f}"), ("prefix hit rate", "prefix_hit_rate", "{:.1%}")):
        if isinstance(rec.get(key), int | float):
            rows.append((what, fmt.format(rec[key])))
    rows.append(("evidence trials", ", ".join(i[:12] for i in rec.get("evidence_trial_ids", [])[:4])
                 + (" ..." if len(rec.get("evidence_trial_ids", [])) > 4 else "")))
    return rows


def print_protocols(console: Console, campaign: Any) -> None:
    """The report's "Protocols side by side" in the terminal, when the plan has protocols."""
    from servetune.report.protocols import protocol_rows, rejection_sentences

    rows = protocol_rows(campaign)
    if not rows:
        return
    simulated = " (simulated)" if any(r["simulated"] for r in rows) else ""
    t = Table(title=f"one server, measured {len(rows)} ways{simulated}")
    for col in ("who", "quotes", "load", "p99 TTFT / TPOT / E2E ms", "goodput req/s", "SLA", "checklist"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["who"], r["quoted_short"], r["load_short"], f"{r['ttft_p99']} / {r['tpot_p99']} / {r['e2e_p99']}",
                  r["goodput"], r["sla"], r["verdict"])
    console.print(t)
    for line in rejection_sentences(rows):
        console.print(f"  {escape(line)}", highlight=False, soft_wrap=True)
