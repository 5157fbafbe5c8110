"""The report's figures, drawn with matplotlib's Agg canvas straight to PNG bytes.

``matplotlib.figure.Figure`` is used without pyplot so drawing needs no display, keeps no global
state between reports and is safe inside Airflow workers. A figure that has no data to show is
returned with ``png=None`` and a note saying why, so the report says what is missing instead of
showing an empty plot.
"""

from __future__ import annotations

import matplotlib
from matplotlib.figure import Figure

from servetune.report.campaign import (
    CampaignView,
    is_simulated,
    level_axis,
    simulated_mark,
)
from servetune.report.curves import curve_caption, invalid_legend, mark_ceiling, per_instant, plot_series
from servetune.report.energy import energy_figure
from servetune.report.evidence import curve_levels
from servetune.report.figure_base import ReportFigure, _png, trial_label
from servetune.report.heatmap import refine_heatmap_figure
from servetune.report.scheduler import scheduler_figure

GIB = 1024**3


def throughput_figure(campaign: CampaignView) -> ReportFigure:
    key, title = "throughput", "Throughput and goodput vs concurrency"
    levels = curve_levels(campaign)
    ceiling, ceiling_source = campaign.ceiling()
    caption = curve_caption(levels, "Requests/s and goodput (requests/s meeting every SLA bound) on the left, "
                                     f"output tokens/s on the right; dashed red line: the ceiling ({ceiling_source}).")
    if not levels:
        return ReportFigure(key, title, caption, None, "no trials with a concurrency level")
    fig = Figure(figsize=(11, 4.2))
    ax1, ax2 = fig.subplots(1, 2)
    hollow = plot_series(ax1, levels, lambda s: s.request_throughput, "o-", "throughput (req/s)", "#2c7fb8")
    hollow |= plot_series(ax1, levels, lambda s: s.goodput_rps, "s-", "goodput (req/s)", "#31a354")
    mark_ceiling(ax1, ceiling)
    invalid_legend(ax1, hollow)
    ax1.set(xlabel=level_axis(campaign.trials), ylabel="requests/s", title="requests/s")
    hollow = plot_series(ax2, levels, lambda s: s.output_tokens_per_s, "o-", "output tok/s", "#756bb1")
    hollow |= plot_series(ax2, levels, lambda s: s.total_tokens_per_s, "^:", "total tok/s", "#9e9ac8")
    mark_ceiling(ax2, ceiling)
    invalid_legend(ax2, hollow)
    ax2.set(xlabel=level_axis(campaign.trials), ylabel="tokens/s", title="tokens/s")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_ylim(bottom=0)
    return ReportFigure(key, title, caption, _png(fig))


def latency_figure(campaign: CampaignView) -> ReportFigure:
    key, title = "latency", "TTFT and TPOT (p50, p99) vs concurrency"
    levels = curve_levels(campaign)
    sla = campaign.sla
    ceiling, _ = campaign.ceiling()
    caption = curve_caption(levels, "Prefill (TTFT) and decode (TPOT) latencies kept apart; dotted lines: "
                                     "the p99 SLA bounds.")
    if not levels:
        return ReportFigure(key, title, caption, None, "no trials with a concurrency level")
    fig = Figure(figsize=(11, 4.2))
    axes = fig.subplots(1, 2)
    for ax, attr, bound, name in ((axes[0], "ttft_ms", "p99_ttft_ms", "TTFT"),
                                  (axes[1], "tpot_ms", "p99_tpot_ms", "TPOT")):
        hollow = plot_series(ax, levels, lambda s, a=attr: getattr(s, a).p50, "o-", f"p50 {name}", "#2c7fb8")
        hollow |= plot_series(ax, levels, lambda s, a=attr: getattr(s, a).p99, "s-", f"p99 {name}", "#e6550d")
        if sla.get(bound) is not None:
            ax.axhline(sla[bound], color="#e6550d", linestyle=":", linewidth=1.4,
                       label=f"SLA p99 {name} {sla[bound]:g} ms")
        mark_ceiling(ax, ceiling)
        invalid_legend(ax, hollow)
        ax.set(xlabel=level_axis(campaign.trials), ylabel=f"{name} (ms)", title=name)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return ReportFigure(key, title, caption, _png(fig))


def gpu_memory_figure(campaign: CampaignView) -> ReportFigure:
    key, title = "gpu_memory", "GPU memory during each trial"
    trials = [t for t in campaign.trials if t.stage != "correctness"] or campaign.trials
    mark = simulated_mark(trials)
    source = ("NVML samples" if not mark else "Simulated, not measured: servetune.sim's modelled GPU memory"
              if mark == " (simulated)" else "NVML samples; trials marked (simulated) are servetune.sim's model")
    caption = f"{source}: used memory (GiB, summed over the trial's GPUs) against time since the trial's t0."
    fig = Figure(figsize=(11, 4.2))
    ax = fig.subplots()
    drawn, states = 0, set()
    totals: list[int] = []
    cmap = matplotlib.colormaps["viridis"]
    for i, t in enumerate(trials):
        samples = t.gpu.get("samples") or []
        states.add(t.summary.gpu_state or t.gpu.get("state") or "unknown")
        if not samples:
            continue
        times, used = per_instant([{**smp, "mem_used": smp.get("mem_used") or 0} for smp in samples], "mem_used")
        _, total = per_instant([{**smp, "mem_total": smp.get("mem_total") or 0} for smp in samples], "mem_total")
        color = cmap(i / max(1, len(trials) - 1))
        label = trial_label(t) + (" (simulated)" if is_simulated(t) and mark != " (simulated)" else "")
        ax.plot(times, [u / GIB for u in used], color=color, linewidth=1.2, label=label)
        totals.append(int(max(total)))
        drawn += 1
    if not drawn:
        return ReportFigure(key, title, caption, None,
                            f"no GPU samples in any trial (gpu state: {', '.join(sorted(states))})")
    total = max(totals)
    ax.axhline(total / GIB, color="#636363", linestyle="-", linewidth=1, label=f"total {total / GIB:.0f} GiB")
    limit = campaign.sla.get("gpu_memory_limit")
    if limit:
        ax.axhline(total * limit / GIB, color="#c0392b", linestyle=":", label=f"SLA limit {limit:.0%}")
    ax.set(xlabel="time since trial start (s)", ylabel="used memory (GiB)", title="GPU memory curve" + mark)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2 if drawn > 8 else 1, loc="lower right")
    return ReportFigure(key, title, caption, _png(fig))


def prefix_hit_figure(campaign: CampaignView) -> ReportFigure:
    key, title = "prefix_hit_rate", "Prefix cache hit rate per trial"
    caption = ("sum(cached)/sum(prompt) tokens from usage, beside the server's counter deltas when scraped "
               "(never the overwritten sglang:cache_hit_rate gauge alone).")
    trials = [t for t in campaign.trials if t.stage != "correctness"]
    sched = [t.summary.sched_cache_hit_rate for t in trials]
    has_sched = any(v is not None for v in sched)  # a third bar only where a scheduler log was read
    if has_sched:
        caption += (" Third bar: the scheduler's own log lines (cached / (new + cached) tokens over its prefill "
                    "batches).")
    if not any(t.summary.prefix_hit_rate is not None for t in trials) and not has_sched:
        return ReportFigure(key, title, caption, None, "no trial reports a prefix hit rate")
    labels = [trial_label(t) for t in trials]
    usage = [t.summary.prefix_hit_rate for t in trials]
    server = [t.summary.prefix_hit_rate_server for t in trials]
    fig = Figure(figsize=(11, 4.2))
    ax = fig.subplots()
    xs = list(range(len(trials)))
    w = 0.27 if has_sched else 0.4
    at_usage, at_server = (-w, 0.0) if has_sched else (-w / 2, w / 2)
    ax.bar([x + at_usage for x in xs], [v if v is not None else 0 for v in usage], w, label="usage", color="#3182bd")
    if any(v is not None for v in server):
        ax.bar([x + at_server for x in xs], [v if v is not None else 0 for v in server], w,
               label="server counters", color="#9ecae1")
    if has_sched:
        ax.bar([x + w for x in xs], [v if v is not None else 0 for v in sched], w, label="scheduler log",
               color="#fdae6b")
    for x, v in zip(xs, usage, strict=True):
        ax.text(x + at_usage, (v or 0) + 0.01, "n/a" if v is None else f"{v:.0%}", ha="center", fontsize=7)
    ax.set_xticks(xs, labels, rotation=40, ha="right", fontsize=7)
    ax.set(ylabel="hit rate (fraction of prompt tokens)", ylim=(0, 1.08), title="prefix hit rate")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return ReportFigure(key, title, caption, _png(fig))


def all_figures(campaign: CampaignView) -> list[ReportFigure]:
    """Every figure; the scheduler's only when a trial carries its log (no empty figure otherwise)."""
    figures = [
        throughput_figure(campaign),
        latency_figure(campaign),
        gpu_memory_figure(campaign),
        energy_figure(campaign),
        prefix_hit_figure(campaign),
        refine_heatmap_figure(campaign),
    ]
    sched = scheduler_figure(campaign)
    figures = figures if sched is None else [*figures, sched]
    mark = simulated_mark(campaign.trials)
    for f in figures if mark else ():  # every figure says it: a modelled number never reads as measured
        f.title += mark
        which = "" if mark == " (simulated)" else f": {mark.strip(' ()')}"
        f.caption = f"Simulated (servetune.sim, modelled, not a measurement){which}. {f.caption}"
    return figures
