"""``servetune history``: a model's past experiments in the terminal, newest first, with trend arrows.

Read from the warehouse through ``servetune.warehouse.tables`` and its ``ceiling_history`` view
(sql/views/30_ceiling_history.sql: the highest concurrency whose accepted trial met the SLA), so the
terminal and the Grafana dashboard show the same ceiling. The other headline numbers come from the
experiment's recommendation, falling back to the ceiling trial's figures, then (hit rate only) to
the mean over accepted trials, so a cache regression (60% -> 20%) still shows
for a campaign that ended without a recommendation.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text
from sqlalchemy import Double, Integer, and_, column, func, select, table
from sqlalchemy.dialects.postgresql import JSONB

from servetune.redact import redact
from servetune.report.campaign import flag_value
from servetune.warehouse import db
from servetune.warehouse.tables import experiments, trials

# the view, referenced by name and the columns read here (it is defined and migrated by the warehouse)
ceiling_history = table(
    "ceiling_history", column("experiment_id"), column("ceiling_concurrency", Integer),
    column("goodput_rps", Double), column("output_tokens_per_s", Double), column("ttft_p99_ms", Double),
    column("prefix_hit_rate", Double), column("server_config", JSONB),
)

# (field, higher is better): the arrows are green when the figure moved the good way
TRENDS = {"ceiling": True, "goodput_rps": True, "output_tokens_per_s": True, "prefix_hit_rate": True,
          "p99_ttft_ms": False, "energy_per_output_token_j": False}
FLAT = 0.02  # relative changes under 2% show as a flat arrow: run-to-run noise, not a trend
CONFIG_FLAGS = (("chunked_prefill_size", "chunk"), ("schedule_conservativeness", "cons"),
                ("max_running_requests", "max-running"))


@dataclass
class HistoryEntry:
    experiment_id: str
    started_at: datetime | None
    status: str | None
    trigger: str
    trials_ok: int
    trials_total: int
    ceiling: int | None
    config: dict[str, Any]
    goodput_rps: float | None
    output_tokens_per_s: float | None
    p99_ttft_ms: float | None
    prefix_hit_rate: float | None
    hit_rate_source: str  # "recommendation" | "ceiling trial" | "trials mean" | "-"
    energy_per_output_token_j: float | None = None  # the recommendation's (servetune.energy), when measured


def fetch_history(model: str, *, database_url: str | None = None, limit: int = 20) -> list[HistoryEntry]:
    """The model's experiments, newest first, with their trial counts and mean accepted hit rate."""
    ok = trials.c.status == "ok"
    counts = (
        select(
            trials.c.experiment_id,
            func.count().label("trials_total"),
            func.count().filter(ok).label("trials_ok"),
            func.avg(trials.c.prefix_hit_rate).filter(and_(ok, trials.c.stage.is_distinct_from("correctness")))
            .label("hit_rate_mean"),
        )
        .group_by(trials.c.experiment_id)
        .subquery()
    )
    ch = ceiling_history
    query = (
        select(
            experiments.c.experiment_id, experiments.c.started_at, experiments.c.status, experiments.c.trigger,
            experiments.c.recommendation,
            func.coalesce(counts.c.trials_total, 0).label("trials_total"),
            func.coalesce(counts.c.trials_ok, 0).label("trials_ok"),
            counts.c.hit_rate_mean,
            ch.c.ceiling_concurrency, ch.c.goodput_rps, ch.c.output_tokens_per_s, ch.c.ttft_p99_ms,
            ch.c.prefix_hit_rate, ch.c.server_config,
        )
        .select_from(
            experiments.outerjoin(counts, counts.c.experiment_id == experiments.c.experiment_id)
            .outerjoin(ch, ch.c.experiment_id == experiments.c.experiment_id)
        )
        .where(experiments.c.model == model)
        .order_by(experiments.c.started_at.desc().nulls_last(), experiments.c.loaded_at.desc())
        .limit(limit)
    )
    engine = db.engine(database_url)
    try:
        with engine.connect() as conn:
            rows = list(conn.execute(query).mappings())
    finally:
        engine.dispose()
    out = []
    for r in rows:
        rec = r["recommendation"] or {}
        p99s = rec.get("p99s") or {}
        hit, source = _first((rec.get("prefix_hit_rate"), "recommendation"),
                             (r["prefix_hit_rate"], "ceiling trial"), (r["hit_rate_mean"], "trials mean"))
        ceiling = r["ceiling_concurrency"]
        if ceiling is None and isinstance(rec.get("concurrency"), int):
            ceiling = rec["concurrency"]
        out.append(HistoryEntry(
            experiment_id=r["experiment_id"], started_at=r["started_at"], status=r["status"], trigger=r["trigger"],
            trials_ok=r["trials_ok"], trials_total=r["trials_total"], ceiling=ceiling,
            config=redact(rec.get("config") or r["server_config"] or {}),
            goodput_rps=_first((rec.get("goodput_rps"), ""), (r["goodput_rps"], ""))[0],
            output_tokens_per_s=_first((rec.get("output_tokens_per_s"), ""), (r["output_tokens_per_s"], ""))[0],
            p99_ttft_ms=_first((rec.get("p99_ttft_ms"), ""), (p99s.get("ttft_ms"), ""), (r["ttft_p99_ms"], ""))[0],
            prefix_hit_rate=hit, hit_rate_source=source,
            energy_per_output_token_j=_first((rec.get("energy_per_output_token_j"), ""))[0],
        ))
    return out


def _first(*candidates: tuple[Any, str]) -> tuple[float | None, str]:
    """The first value that is set, with its label; (None, "-") when none is."""
    for value, label in candidates:
        if value is not None:
            return float(value), label
    return None, "-"


def trend(current: float | None, previous: float | None, higher_is_better: bool) -> Text:
    """An arrow for the change from the previous experiment: green when better, red when worse."""
    if current is None or previous is None:
        return Text(" ")
    if previous == 0:
        rel = 0.0 if current == 0 else 1.0
    else:
        rel = (current - previous) / abs(previous)
    if abs(rel) < FLAT:
        return Text("→", style="dim")
    better = (rel > 0) == higher_is_better
    return Text("↑" if rel > 0 else "↓", style="bold green" if better else "bold red")


def config_text(config: dict[str, Any]) -> str:
    parts = [f"{short}={flag_value(config, name)}" for name, short in CONFIG_FLAGS
             if flag_value(config, name) is not None]
    return ", ".join(parts) or "-"


def history_table(model: str, entries: list[HistoryEntry]) -> Table:
    table = Table(title=f"servetune history: {model}", title_justify="left", header_style="bold")
    for name, justify in (("started", "left"), ("experiment", "left"), ("trigger", "left"), ("status", "left"),
                          ("trials ok", "right"), ("ceiling", "right"), ("recommended config", "left"),
                          ("goodput req/s", "right"), ("out tok/s", "right"), ("p99 TTFT ms", "right"),
                          ("hit rate", "right")):
        table.add_column(name, justify=justify, no_wrap=name != "recommended config")
    energy = any(e.energy_per_output_token_j is not None for e in entries)  # a column only where measured
    if energy:
        table.add_column("J/out tok", justify="right", no_wrap=True)
    # entries are newest first: each row is compared with the next older one that has the figure
    for i, e in enumerate(entries):
        older = entries[i + 1:]

        def cell(field: str, text: str, e: HistoryEntry = e, older: list[HistoryEntry] = older) -> Text:
            prev = next((getattr(o, field) for o in older if getattr(o, field) is not None), None)
            return Text.assemble(text, " ", trend(getattr(e, field), prev, TRENDS[field]))

        hit = "-" if e.prefix_hit_rate is None else f"{e.prefix_hit_rate:.1%}"
        if e.hit_rate_source == "trials mean":
            hit += "*"
        joules = e.energy_per_output_token_j
        table.add_row(
            e.started_at.strftime("%Y-%m-%d %H:%M") if e.started_at else "-",
            e.experiment_id[:12], e.trigger, e.status or "-", f"{e.trials_ok}/{e.trials_total}",
            cell("ceiling", "-" if e.ceiling is None else str(e.ceiling)),
            config_text(e.config),
            cell("goodput_rps", "-" if e.goodput_rps is None else f"{e.goodput_rps:.2f}"),
            cell("output_tokens_per_s", "-" if e.output_tokens_per_s is None else f"{e.output_tokens_per_s:,.0f}"),
            cell("p99_ttft_ms", "-" if e.p99_ttft_ms is None else f"{e.p99_ttft_ms:,.0f}"),
            cell("prefix_hit_rate", hit),
            *([cell("energy_per_output_token_j", "-" if joules is None else f"{joules:.3f}")] if energy else []),
        )
    if any(e.hit_rate_source == "trials mean" for e in entries):
        table.caption = "* no recommendation: mean hit rate over the experiment's accepted trials"
    return table


def print_history(model: str, entries: list[HistoryEntry], console: Console) -> None:
    if not entries:
        console.print(f"no experiments for model {model!r} in the warehouse")
        return
    console.print(history_table(model, entries))
