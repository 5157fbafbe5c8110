"""The SGLang scheduler's own view of a trial, drawn from its "Prefill batch" / "Decode batch" log lines.

The client's records say what the requests saw and ``/metrics`` what the gauges held at each scrape;
the batch lines (``servetune.telemetry.scheduler_log``) say what the scheduler itself ran and kept
waiting, batch by batch. One trial is drawn (the recommendation's evidence when it has a log, else
the highest concurrency that has one) so the figure stays readable; a campaign without any
scheduler log gets no figure at all rather than an empty one.
"""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure

from servetune.report.campaign import CampaignView, counts, level_of
from servetune.report.figure_base import ReportFigure, _png, trial_label
from servetune.result import TrialResult

KEY = "scheduler"
TITLE = "SGLang scheduler: running and queued requests, token usage over the trial"


def log_rows(trial: TrialResult) -> list[dict[str, Any]]:
    """The trial's parsed scheduler rows ([] when its server log was not read)."""
    log = (trial.server or {}).get("scheduler_log")
    return list(log.get("rows") or []) if isinstance(log, dict) else []


def scheduler_trial(campaign: CampaignView) -> tuple[TrialResult, str] | None:
    """The trial to draw and why it was chosen; None when no trial carries scheduler rows."""
    logged = [t for t in campaign.trials if log_rows(t)]
    if not logged:
        return None
    by_id = {t.trial_id: t for t in logged}
    for tid in (campaign.recommendation or {}).get("evidence_trial_ids") or []:
        if str(tid) in by_id:
            return by_id[str(tid)], "the recommendation's evidence"
    pool = [t for t in logged if counts(t)] or logged
    best = max(pool, key=lambda t: (level_of(t) or 0, t.created_at))
    return best, "the highest concurrency with a scheduler log"


def _series(rows: list[dict[str, Any]], field: str) -> tuple[list[float], list[float]]:
    pts = [(float(r["t_s"]), float(r[field])) for r in rows if r.get(field) is not None]
    return [x for x, _ in pts], [y for _, y in pts]


def _caption(t: TrialResult, why: str, rows: list[dict[str, Any]], others: int) -> str:
    log = t.server.get("scheduler_log") or {}
    s = t.summary
    prefill = sum(1 for r in rows if r.get("kind") == "prefill")
    decode = sum(1 for r in rows if r.get("kind") == "decode")
    unparsed = int(log.get("unparsed_lines") or 0)
    source = log.get("source") or "the server log"
    text = (f"The scheduler's own log lines ('Prefill batch' / 'Decode batch' in {source}), not the client's "
            f"records nor the /metrics gauges, for trial {t.trial_id} ({trial_label(t)}; {why}): #running-req "
            "of the decode lines (the decode batch) and #queue-req of every line on the left axis, token usage "
            "(fraction of the KV pool) on the right; ticks at the bottom mark prefill batches. Timestamps have "
            f"{log.get('resolution_s') or 1:g} s resolution; shaded: the measurement window. {prefill} prefill "
            f"batches and {decode} decode lines (one per --decode-log-interval steps)")
    text += f", {unparsed} batch line(s) not parsed." if unparsed else "."
    if s.sched_cache_hit_rate is not None:
        text += (" Its cache hit rate (cached / (new + cached) tokens over the prefill batches): "
                 f"{s.sched_cache_hit_rate:.1%}.")
    if others:
        text += f" {others} other trial(s) carry a scheduler log too (named query scheduler_batches)."
    return text


def scheduler_figure(campaign: CampaignView) -> ReportFigure | None:
    """The figure for the chosen trial; None (no figure, no note) when the campaign has no scheduler log."""
    chosen = scheduler_trial(campaign)
    if chosen is None:
        return None
    t, why = chosen
    rows = sorted(log_rows(t), key=lambda r: float(r["t_s"]))
    others = sum(1 for x in campaign.trials if x is not t and log_rows(x))
    caption = _caption(t, why, rows, others)
    # a prefill line's #running-req excludes the batch it admits: the decode lines give the batch size
    decode = [r for r in rows if r.get("kind") == "decode"]
    running = _series(decode, "running_req")
    queued, usage = _series(rows, "queue_req"), _series(rows, "token_usage")
    if not (running[0] or queued[0] or usage[0]):
        return ReportFigure(KEY, TITLE, caption, None, "the scheduler's lines carry no running, queue or usage field")
    fig = Figure(figsize=(11, 4.2))
    ax = fig.subplots()
    usage_ax = ax.twinx()
    s = t.summary
    if s.window_start_s is not None and s.window_end_s is not None:
        ax.axvspan(s.window_start_s, s.window_end_s, color="#f0f0f0", zorder=0, label="measurement window")
    ax.plot(*running, "-", drawstyle="steps-post", color="#2c7fb8", linewidth=1.3,
            label="running requests (decode lines)")
    ax.plot(*queued, "-", drawstyle="steps-post", color="#e6550d", linewidth=1.3, label="queued requests")
    prefill_ts = [float(r["t_s"]) for r in rows if r.get("kind") == "prefill"]
    if prefill_ts:
        ax.plot(prefill_ts, [0] * len(prefill_ts), "|", color="#756bb1", markersize=8, label="prefill batch")
    usage_ax.plot(*usage, "--", color="#31a354", linewidth=1.2, label="token usage")
    ax.set(xlabel="seconds since trial start", ylabel="requests", title=trial_label(t))
    ax.set_ylim(bottom=0)
    usage_ax.set(ylabel="token usage (fraction of KV pool)", ylim=(0, 1.05))
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    more_h, more_l = usage_ax.get_legend_handles_labels()
    ax.legend(handles + more_h, labels + more_l, fontsize=8, loc="upper left", bbox_to_anchor=(1.07, 1.0))
    return ReportFigure(KEY, TITLE, caption, _png(fig))


def hit_rate_text(trials: list[TrialResult]) -> str | None:
    """The scheduler's cache hit rate over these trials (their mean), for beside the usage hit rate; None if none."""
    values = [t.summary.sched_cache_hit_rate for t in trials if t.summary.sched_cache_hit_rate is not None]
    return f"{sum(values) / len(values):.1%}" if values else None
