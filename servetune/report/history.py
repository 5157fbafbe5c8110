"""``servetune history``: a model's past experiments in the terminal, newest first, with trend arrows.

Read from the warehouse through ``servetune.warehouse.tables`` and its ``ceiling_history`` view
(sql/views/30_ceiling_history.sql: the highest concurrency whose accepted trial met the SLA), so the
terminal and the Grafana dashboard show the same ceiling. The other headline numbers come from the
experiment's recommendation, falling back to the ceiling trial's figures, then (hit rate only) to
the mean over accepted trials, so a cache regression (60% -> 20%) still shows
for a campaign that ended without a recommendation.

Trends are like for like: a row's arrows compare it with the newest older run of the same plan name and
the same service (workload, SLA, load mode, engine, GPU: ``servetune.warehouse.previous``, the notion the
weekly regression check uses) that has figures. Where that is not the row below, the note says which run;
where there is none, the row has no arrows and the note says what changed ("SLA changed: p99 TTFT 2000 ->
1500 ms"). A failed campaign shows why (``experiments.failure_reason``, else its first failed trial's).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text
from sqlalchemy import Double, Integer, Text as SqlText, and_, column, func, select, table
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, aggregate_order_by

from servetune.redact import redact
from servetune.report.campaign import flag_value
from servetune.warehouse import db
from servetune.warehouse.files import FAILED_STATUSES
from servetune.warehouse.previous import differences, identity
from servetune.warehouse.tables import acceptances, experiments, trials

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
SCAN = 30  # older experiments read beyond --limit, where the oldest rows shown find their like-for-like run
REASON_SHOWN = 160  # characters of a failure reason in the table
COMPACT_BELOW = 160  # terminal columns: a narrower one gets the compact table (``history_table``)
COMPACT_HEADERS = {"experiment": "id", "trials ok": "trials\nok", "GPU min": "GPU\nmin",
                   "goodput req/s": "goodput\nreq/s", "out tok/s": "out\ntok/s", "p99 TTFT ms": "p99 TTFT\nms",
                   "hit rate": "hit\nrate", "recommended config": "recommended\nconfig"}


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
    gpu_seconds: float | None = None  # what the answer cost: the campaign's GPU time, start-ups included
    server_starts: int | None = None
    plan_name: str | None = None
    has_plan: bool = False  # a campaign's stored plan; a bench result has none (its trial gives the conditions)
    conditions: dict[str, Any] | None = None  # warehouse.previous.identity: what like for like compares
    failure_reason: str | None = None  # set only when the experiment failed or no trial of it measured
    compared_with: str | None = None  # the experiment the arrows compare with (None: no arrows)
    previous: dict[str, float | None] | None = None  # that experiment's TRENDS figures
    note: str | None = None  # which run the arrows compare with when not the row below, or why there are none
    accepted_by: str | None = None  # who made the answer the baseline (servetune.warehouse.acceptance)
    regressed: bool = False  # its answer fell behind the one it was compared with

    def shown_status(self) -> str:
        """A done campaign says whether its answer is the baseline: accepted (✓), regressed or awaiting a
        person (`servetune accept`); any other status as it is."""
        if self.status != "done":
            return self.status or "-"
        if self.accepted_by:
            return "done ✓"
        return "regressed" if self.regressed else "awaiting"

    def has_figures(self) -> bool:
        return any(getattr(self, f) is not None for f in TRENDS)


def conditions_changed(old: HistoryEntry, new: HistoryEntry) -> list[str]:
    """What makes ``old`` a different plan or service than ``new``, in words; empty: like for like."""
    if old.has_plan != new.has_plan:
        return ["the previous run is a bench result" if new.has_plan
                else "a bench result, the previous run a campaign"]
    renamed = [] if old.plan_name == new.plan_name else [f"plan changed: {old.plan_name} -> {new.plan_name}"]
    return renamed + differences(old.conditions or {}, new.conditions or {})


def compare(entries: list[HistoryEntry]) -> None:
    """Set each entry's ``compared_with`` and ``note`` (entries newest first; see the module docstring)."""
    for i, e in enumerate(entries):
        older = entries[i + 1:]
        if not older or not e.has_figures():
            continue
        ref = next((o for o in older if o.has_figures() and not conditions_changed(o, e)), None)
        if ref is not None:
            e.compared_with, e.previous = ref.experiment_id, {f: getattr(ref, f) for f in TRENDS}
            if ref is not older[0]:
                e.note = f"vs {ref.experiment_id[:12]}, the last run of this plan and service"
            continue
        changed = conditions_changed(older[0], e)
        e.note = "; ".join(changed) if changed else "no earlier run of this plan and service has figures"


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
            # the first trial's conditions (a bench result has no plan) and the first failure's reason
            _first(trials.c.sla, JSONB).label("trial_sla"),
            _first(trials.c.workload_fingerprint, SqlText).label("trial_workload"),
            _first(trials.c.load, JSONB).label("trial_load"),
            _first(trials.c.failure_reason, SqlText, failed_first=True,
                   where=and_(~ok, trials.c.failure_reason.is_not(None))).label("trial_failure"),
        )
        .group_by(trials.c.experiment_id)
        .subquery()
    )
    ch = ceiling_history
    query = (
        select(
            experiments.c.experiment_id, experiments.c.started_at, experiments.c.status, experiments.c.trigger,
            experiments.c.recommendation, experiments.c.plan, experiments.c.engine, experiments.c.failure_reason,
            experiments.c.gpu_seconds, experiments.c.server_starts, acceptances.c.accepted_by,
            func.coalesce(counts.c.trials_total, 0).label("trials_total"),
            func.coalesce(counts.c.trials_ok, 0).label("trials_ok"),
            counts.c.hit_rate_mean, counts.c.trial_sla, counts.c.trial_workload, counts.c.trial_load,
            counts.c.trial_failure,
            ch.c.ceiling_concurrency, ch.c.goodput_rps, ch.c.output_tokens_per_s, ch.c.ttft_p99_ms,
            ch.c.prefix_hit_rate, ch.c.server_config,
        )
        .select_from(
            experiments.outerjoin(counts, counts.c.experiment_id == experiments.c.experiment_id)
            .outerjoin(ch, ch.c.experiment_id == experiments.c.experiment_id)
            .outerjoin(acceptances, acceptances.c.experiment_id == experiments.c.experiment_id)
        )
        .where(experiments.c.model == model)
        .order_by(experiments.c.started_at.desc().nulls_last(), experiments.c.loaded_at.desc())
        .limit(limit + SCAN)
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
        hit, source = _set((rec.get("prefix_hit_rate"), "recommendation"),
                             (r["prefix_hit_rate"], "ceiling trial"), (r["hit_rate_mean"], "trials mean"))
        ceiling = r["ceiling_concurrency"]
        if ceiling is None and isinstance(rec.get("concurrency"), int):
            ceiling = rec["concurrency"]
        out.append(HistoryEntry(
            experiment_id=r["experiment_id"], started_at=r["started_at"], status=r["status"], trigger=r["trigger"],
            trials_ok=r["trials_ok"], trials_total=r["trials_total"], ceiling=ceiling,
            config=redact(rec.get("config") or r["server_config"] or {}),
            goodput_rps=_set((rec.get("goodput_rps"), ""), (r["goodput_rps"], ""))[0],
            output_tokens_per_s=_set((rec.get("output_tokens_per_s"), ""), (r["output_tokens_per_s"], ""))[0],
            p99_ttft_ms=_set((rec.get("p99_ttft_ms"), ""), (p99s.get("ttft_ms"), ""), (r["ttft_p99_ms"], ""))[0],
            prefix_hit_rate=hit, hit_rate_source=source,
            energy_per_output_token_j=_set((rec.get("energy_per_output_token_j"), ""))[0],
            gpu_seconds=r["gpu_seconds"], server_starts=r["server_starts"], accepted_by=r["accepted_by"],
            regressed=bool((rec.get("diff_from_previous") or {}).get("regressions")),
            **_conditions(r),
        ))
    compare(out)
    return out[:limit]


def _first(col: Any, typ: Any, *, failed_first: bool = False, where: Any = None) -> Any:
    """The experiment's first trial's ``col`` (by created_at; failed trials before rejected ones)."""
    order = ((trials.c.status != "failed"),) if failed_first else ()
    agg = func.array_agg(aggregate_order_by(col, *order, trials.c.created_at, trials.c.trial_id),
                         type_=ARRAY(typ))
    return (agg.filter(where) if where is not None else agg)[1]


def _conditions(r: Any) -> dict[str, Any]:
    """Plan name, like-for-like identity and failure reason of one row (see ``HistoryEntry``)."""
    plan = r["plan"]
    if plan:
        cond = identity(plan)
    else:  # a bench result: its trial's SLA, workload and load (the level too: it measured one)
        load = r["trial_load"] or {}
        level = load.get("rate") if load.get("rate") is not None else load.get("concurrency")
        cond = {"workload": {"fingerprint": r["trial_workload"]}, "sla": r["trial_sla"],
                "load": " ".join(str(x) for x in (load.get("mode") or "concurrency", level) if x is not None),
                "engine kind": r["engine"], "gpu": None}
    failed = r["status"] in FAILED_STATUSES or (r["trials_total"] > 0 and r["trials_ok"] == 0)
    reason = (r["failure_reason"] or r["trial_failure"]) if failed else None
    return {"plan_name": (plan or {}).get("name"), "has_plan": bool(plan), "conditions": redact(cond),
            "failure_reason": redact(reason)}


def _set(*candidates: tuple[Any, str]) -> tuple[float | None, str]:
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


def history_table(model: str, entries: list[HistoryEntry], *, width: int | None = None) -> Table:
    """The table of ``entries`` (newest first) as ``fetch_history`` compared them; entries built by hand and
    never compared (no row has a reference or a note) are compared here, within the list.

    ``width``: the terminal's; under ``COMPACT_BELOW`` columns the table keeps every figure but drops what a
    narrow terminal cannot afford (the hour, half the id, a trigger all rows share, the vertical rules), so
    the recommended config still gets room at 100 columns."""
    if not any(e.compared_with or e.note for e in entries):
        compare(entries)
    compact = width is not None and width < COMPACT_BELOW
    triggers = {e.trigger for e in entries}
    one_trigger = compact and len(triggers) == 1
    title = f"servetune history: {model}" + (f" ({next(iter(triggers))} runs)" if one_trigger else "")
    table = Table(title=title, title_justify="left", caption_justify="left", header_style="bold",
                  **({"box": box.SIMPLE_HEAD, "padding": (0, 0)} if compact else {}))
    cost = any(e.gpu_seconds is not None for e in entries)  # a column only where the campaigns kept it
    names = [("started", "left"), ("experiment", "left"), *([] if one_trigger else [("trigger", "left")]),
             ("status", "left"), ("trials ok", "right"), *([("GPU min", "right")] if cost else []),
             ("ceiling", "right"), ("recommended config", "left"), ("goodput req/s", "right"),
             ("out tok/s", "right"), ("p99 TTFT ms", "right"), ("hit rate", "right")]
    for name, justify in names:
        header = COMPACT_HEADERS.get(name, name) if compact else name
        table.add_column(header, justify=justify, no_wrap=name != "recommended config")  # type: ignore[arg-type]
    energy = any(e.energy_per_output_token_j is not None for e in entries)  # a column only where measured
    if energy:
        table.add_column("J/out tok" if not compact else "J/out\ntok", justify="right", no_wrap=True)
    notes = any(e.note for e in entries)
    if notes:
        table.add_column("note", justify="left")
    # entries are newest first: each row's arrows compare with its like-for-like run (``compare``)
    for e in entries:
        def cell(field: str, text: str, e: HistoryEntry = e) -> Text:
            prev = (e.previous or {}).get(field)
            return Text.assemble(text, " ", trend(getattr(e, field), prev, TRENDS[field]))

        hit = "-" if e.prefix_hit_rate is None else f"{e.prefix_hit_rate:.1%}"
        if e.hit_rate_source == "trials mean":
            hit += "*"
        joules = e.energy_per_output_token_j
        started = e.started_at.strftime("%Y-%m-%d" if compact else "%Y-%m-%d %H:%M") if e.started_at else "-"
        table.add_row(
            started, e.experiment_id[:8 if compact else 12], *([] if one_trigger else [e.trigger]), e.shown_status(),
            f"{e.trials_ok}/{e.trials_total}",
            *([gpu_minutes(e)] if cost else []),
            cell("ceiling", "-" if e.ceiling is None else str(e.ceiling)),
            config_cell(e),
            cell("goodput_rps", "-" if e.goodput_rps is None else f"{e.goodput_rps:.2f}"),
            cell("output_tokens_per_s", "-" if e.output_tokens_per_s is None else f"{e.output_tokens_per_s:,.0f}"),
            cell("p99_ttft_ms", "-" if e.p99_ttft_ms is None else f"{e.p99_ttft_ms:,.0f}"),
            cell("prefix_hit_rate", hit),
            *([cell("energy_per_output_token_j", "-" if joules is None else f"{joules:.3f}")] if energy else []),
            *([Text(e.note or "", style="yellow" if e.note and not e.compared_with else "dim")] if notes else []),
        )
    captions = []
    if any(e.hit_rate_source == "trials mean" for e in entries):
        captions.append("* no recommendation: mean hit rate over the experiment's accepted trials")
    if cost:
        captions.append("GPU min: what the campaign spent on its answer, server start-ups included")
    if any(e.status == "done" and not e.accepted_by for e in entries):
        captions.append("done ✓: the answer later runs compare with; awaiting, regressed: not until someone"
                        " runs `servetune accept EXPERIMENT --why ...`")
    if notes:
        captions.append("arrows compare a run with the last run of the same plan, workload, SLA, load mode, engine"
                        " and GPU; the note says which, or why a row has none")
    table.caption = "\n".join(captions) or None
    return table


def gpu_minutes(e: HistoryEntry) -> str:
    """The campaign's GPU minutes ('-' where it kept none: loaded before 0015, or a bench result)."""
    return "-" if e.gpu_seconds is None else f"{e.gpu_seconds / 60:,.1f}"


def config_cell(e: HistoryEntry) -> Text:
    """The recommended config; for a failed experiment (or one whose trials all failed), why."""
    if e.failure_reason is None:
        text = config_text(e.config)
        return Text(text) if text != "-" or e.status not in FAILED_STATUSES else Text("- (no reason recorded)")
    reason = e.failure_reason
    if len(reason) > REASON_SHOWN:
        reason = reason[:REASON_SHOWN - 1] + "…"
    text = config_text(e.config)
    return Text.assemble(*((text, "\n") if text != "-" else ()), (reason, "red"))


def print_history(model: str, entries: list[HistoryEntry], console: Console) -> None:
    if not entries:
        console.print(f"no experiments for model {model!r} in the warehouse")
        return
    console.print(history_table(model, entries, width=console.width))
