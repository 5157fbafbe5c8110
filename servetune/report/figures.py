"""The report's figures, drawn with matplotlib's Agg canvas straight to PNG bytes.

``matplotlib.figure.Figure`` is used without pyplot so drawing needs no display, keeps no global
state between reports and is safe inside Airflow workers. A figure that has no data to show is
returned with ``png=None`` and a note saying why, so the report says what is missing instead of
showing an empty plot.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Any

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from servetune.report.campaign import Campaign, concurrency_of, flag_value, meets_sla
from servetune.result import TrialResult

GIB = 1024**3
DPI = 110


@dataclass
class ReportFigure:
    key: str  # file stem and HTML id
    title: str
    caption: str
    png: bytes | None  # None: nothing to draw, see ``note``
    note: str = ""


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return buf.getvalue()


def trial_label(t: TrialResult) -> str:
    """Short, stable label: stage, concurrency and the config knobs refinement varies."""
    parts = [t.stage or "bench"]
    c = concurrency_of(t)
    if c is not None:
        parts.append(f"c={c}")
    cfg = t.server_config
    if t.stage == "refine":
        for key, short in (("chunked_prefill_size", "chunk"), ("schedule_conservativeness", "cons"),
                           ("max_running_requests", "mrr")):
            if flag_value(cfg, key) is not None:
                parts.append(f"{short}={flag_value(cfg, key)}")
    return " ".join(parts)


def _mark_ceiling(ax, ceiling: int | None) -> None:
    if ceiling is not None:
        ax.axvline(ceiling, color="#c0392b", linestyle="--", linewidth=1.4, label=f"ceiling c={ceiling}")


def throughput_figure(campaign: Campaign) -> ReportFigure:
    key, title = "throughput", "Throughput and goodput vs concurrency"
    curve = campaign.curve_trials()
    ceiling, ceiling_source = campaign.ceiling()
    caption = (f"Requests/s and goodput (requests/s meeting every SLA bound) on the left, output tokens/s "
               f"on the right; dashed red line: the ceiling ({ceiling_source}).")
    if not curve:
        return ReportFigure(key, title, caption, None, "no trials with a concurrency level")
    xs = [concurrency_of(t) for t in curve]
    s = [t.summary for t in curve]
    fig = Figure(figsize=(11, 4.2))
    ax1, ax2 = fig.subplots(1, 2)
    ax1.plot(xs, [v.request_throughput for v in s], "o-", label="throughput (req/s)", color="#2c7fb8")
    ax1.plot(xs, [v.goodput_rps for v in s], "s-", label="goodput (req/s)", color="#31a354")
    _mark_ceiling(ax1, ceiling)
    ax1.set(xlabel="concurrency", ylabel="requests/s", title="requests/s")
    ax2.plot(xs, [v.output_tokens_per_s for v in s], "o-", label="output tok/s", color="#756bb1")
    ax2.plot(xs, [v.total_tokens_per_s for v in s], "^:", label="total tok/s", color="#9e9ac8")
    _mark_ceiling(ax2, ceiling)
    ax2.set(xlabel="concurrency", ylabel="tokens/s", title="tokens/s")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_ylim(bottom=0)
    return ReportFigure(key, title, caption, _png(fig))


def latency_figure(campaign: Campaign) -> ReportFigure:
    key, title = "latency", "TTFT and TPOT (p50, p99) vs concurrency"
    curve = campaign.curve_trials()
    sla = campaign.sla
    ceiling, _ = campaign.ceiling()
    caption = "Prefill (TTFT) and decode (TPOT) latencies kept apart; dotted lines: the p99 SLA bounds."
    if not curve:
        return ReportFigure(key, title, caption, None, "no trials with a concurrency level")
    xs = [concurrency_of(t) for t in curve]
    fig = Figure(figsize=(11, 4.2))
    axes = fig.subplots(1, 2)
    for ax, attr, bound, name in ((axes[0], "ttft_ms", "p99_ttft_ms", "TTFT"),
                                  (axes[1], "tpot_ms", "p99_tpot_ms", "TPOT")):
        pcts = [getattr(t.summary, attr) for t in curve]
        ax.plot(xs, [p.p50 for p in pcts], "o-", label=f"p50 {name}", color="#2c7fb8")
        ax.plot(xs, [p.p99 for p in pcts], "s-", label=f"p99 {name}", color="#e6550d")
        if sla.get(bound) is not None:
            ax.axhline(sla[bound], color="#e6550d", linestyle=":", linewidth=1.4,
                       label=f"SLA p99 {name} {sla[bound]:g} ms")
        _mark_ceiling(ax, ceiling)
        ax.set(xlabel="concurrency", ylabel="ms", title=name)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return ReportFigure(key, title, caption, _png(fig))


def gpu_memory_figure(campaign: Campaign) -> ReportFigure:
    key, title = "gpu_memory", "GPU memory during each trial"
    caption = "NVML samples: used memory (GiB, summed over the trial's GPUs) against time since the trial's t0."
    fig = Figure(figsize=(11, 4.2))
    ax = fig.subplots()
    drawn, states = 0, set()
    totals: list[int] = []
    trials = [t for t in campaign.trials if t.stage != "correctness"] or campaign.trials
    cmap = matplotlib.colormaps["viridis"]
    for i, t in enumerate(trials):
        samples = t.gpu.get("samples") or []
        states.add(t.summary.gpu_state or t.gpu.get("state") or "unknown")
        if not samples:
            continue
        by_time: dict[float, float] = {}
        total_by_time: dict[float, float] = {}
        for smp in samples:
            ts = round(float(smp["t_s"]), 3)
            by_time[ts] = by_time.get(ts, 0.0) + float(smp.get("mem_used") or 0)
            total_by_time[ts] = total_by_time.get(ts, 0.0) + float(smp.get("mem_total") or 0)
        times = sorted(by_time)
        color = cmap(i / max(1, len(trials) - 1))
        ax.plot(times, [by_time[x] / GIB for x in times], color=color, linewidth=1.2, label=trial_label(t))
        totals.append(int(max(total_by_time.values())))
        drawn += 1
    if not drawn:
        return ReportFigure(key, title, caption, None,
                            f"no GPU samples in any trial (gpu state: {', '.join(sorted(states))})")
    total = max(totals)
    ax.axhline(total / GIB, color="#636363", linestyle="-", linewidth=1, label=f"total {total / GIB:.0f} GiB")
    limit = campaign.sla.get("gpu_memory_limit")
    if limit:
        ax.axhline(total * limit / GIB, color="#c0392b", linestyle=":", label=f"SLA limit {limit:.0%}")
    ax.set(xlabel="seconds since trial start", ylabel="GiB used", title="GPU memory curve")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2 if drawn > 8 else 1, loc="lower right")
    return ReportFigure(key, title, caption, _png(fig))


def prefix_hit_figure(campaign: Campaign) -> ReportFigure:
    key, title = "prefix_hit_rate", "Prefix cache hit rate per trial"
    caption = ("sum(cached)/sum(prompt) tokens from usage, beside the server's counter deltas when scraped "
               "(never the overwritten sglang:cache_hit_rate gauge alone).")
    trials = [t for t in campaign.trials if t.stage != "correctness"]
    if not any(t.summary.prefix_hit_rate is not None for t in trials):
        return ReportFigure(key, title, caption, None, "no trial reports a prefix hit rate")
    labels = [trial_label(t) for t in trials]
    usage = [t.summary.prefix_hit_rate for t in trials]
    server = [t.summary.prefix_hit_rate_server for t in trials]
    fig = Figure(figsize=(11, 4.2))
    ax = fig.subplots()
    xs = list(range(len(trials)))
    w = 0.4
    ax.bar([x - w / 2 for x in xs], [v if v is not None else 0 for v in usage], w, label="usage", color="#3182bd")
    if any(v is not None for v in server):
        ax.bar([x + w / 2 for x in xs], [v if v is not None else 0 for v in server], w,
               label="server counters", color="#9ecae1")
    for x, v in zip(xs, usage, strict=True):
        ax.text(x - w / 2, (v or 0) + 0.01, "n/a" if v is None else f"{v:.0%}", ha="center", fontsize=7)
    ax.set_xticks(xs, labels, rotation=40, ha="right", fontsize=7)
    ax.set(ylabel="hit rate", ylim=(0, 1.08), title="prefix hit rate")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return ReportFigure(key, title, caption, _png(fig))


DEFAULT = "default"  # a flag the trial left to the engine's default


def _axis_key(value: Any) -> tuple[int, float | str]:
    return (0, 0.0) if value == DEFAULT else (1, value if isinstance(value, int | float) else str(value))


def refine_heatmap_figure(campaign: Campaign) -> ReportFigure:
    key, title = "refine_heatmap", "Refinement: chunked-prefill-size x schedule-conservativeness"
    caption = ("Goodput (req/s) near the ceiling for each chunked-prefill-size x schedule-conservativeness "
               "tried; 'default' is the engine's own value (the refinement changes one flag at a time, and "
               "the ramp's trial at the same concurrency is the default/default cell). A cell shows its best "
               "trial when several (e.g. max-running-requests values) were tried. Hatched: not measured; "
               "'missed SLA': the best trial there missed the p99 SLA or failed.")
    refine = campaign.refine_trials()
    if not refine:
        return ReportFigure(key, title, caption, None, "no refinement trials in this campaign")

    def cell(t: TrialResult) -> tuple[Any, Any]:
        chunk = flag_value(t.server_config, "chunked_prefill_size")
        cons = flag_value(t.server_config, "schedule_conservativeness")
        return (DEFAULT if chunk is None else chunk, DEFAULT if cons is None else cons)

    levels = {concurrency_of(t) for t in refine}
    start = [t for t in campaign.curve_trials() if concurrency_of(t) in levels and cell(t) == (DEFAULT, DEFAULT)]
    trials = refine + start
    chunks = sorted({cell(t)[0] for t in trials}, key=_axis_key)
    conss = sorted({cell(t)[1] for t in trials}, key=_axis_key)
    grid = [[math.nan] * len(chunks) for _ in conss]
    passed = [[False] * len(chunks) for _ in conss]
    for t in trials:
        i, j = conss.index(cell(t)[1]), chunks.index(cell(t)[0])
        value = (t.summary.goodput_rps or 0.0) if t.status == "ok" else 0.0
        if math.isnan(grid[i][j]) or value > grid[i][j]:
            grid[i][j] = value
            passed[i][j] = meets_sla(t, campaign.sla)
    fig = Figure(figsize=(2.2 + 1.3 * len(chunks), 1.6 + 0.9 * len(conss)))
    ax = fig.subplots()
    values = [v for row in grid for v in row if not math.isnan(v)]
    lo, hi = min(values), max(values)
    pad = max(0.02 * abs(hi), 0.1 * (hi - lo), 1e-6)  # near-equal goodputs must not look far apart
    im = ax.imshow(grid, cmap="YlGn", aspect="auto", origin="lower", vmin=lo - pad, vmax=hi + pad)
    rec_cfg = (campaign.recommendation or {}).get("config") or {}
    rec_cell = (flag_value(rec_cfg, "chunked_prefill_size"), flag_value(rec_cfg, "schedule_conservativeness"))
    rec_cell = tuple(DEFAULT if v is None else v for v in rec_cell)
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            if math.isnan(v):
                ax.add_patch(_hatch(j, i))
                continue
            dark = float(im.norm(v)) > 0.6  # white text only on the dark end of the colour map
            ax.text(j, i, f"{v:.2f}" + ("" if passed[i][j] else "\nmissed SLA"), ha="center", va="center",
                    fontsize=9, color="white" if dark else "black")
            if campaign.recommendation and rec_cell == (chunks[j], conss[i]):
                ax.add_patch(_outline(j, i))
    ax.set_xticks(range(len(chunks)), [str(c) for c in chunks])
    ax.set_yticks(range(len(conss)), [c if c == DEFAULT else f"{c:g}" for c in conss])
    ax.set(xlabel="--chunked-prefill-size", ylabel="--schedule-conservativeness", title="goodput (req/s)")
    cbar = fig.colorbar(im, ax=ax, label="goodput req/s")
    cbar.formatter.set_useOffset(False)
    return ReportFigure(key, title, caption + " The recommended cell is outlined in red.", _png(fig))


def _hatch(j: int, i: int) -> Rectangle:
    return Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="//", edgecolor="#bdbdbd", linewidth=0)


def _outline(j: int, i: int) -> Rectangle:
    return Rectangle((j - 0.48, i - 0.48), 0.96, 0.96, fill=False, edgecolor="#c0392b", linewidth=2.5)


def all_figures(campaign: Campaign) -> list[ReportFigure]:
    return [
        throughput_figure(campaign),
        latency_figure(campaign),
        gpu_memory_figure(campaign),
        prefix_hit_figure(campaign),
        refine_heatmap_figure(campaign),
    ]
