"""The report's energy figure: joules per output token against the load level, and each trial's power curve.

Energy is taken over each trial's steady window (servetune.energy), the same window as its throughput, so
the left panel is power over tokens per second; how the joules were found (NVML's counter, the integrated
power curve, or the simulator's model) is said in the caption. Without any power reading there is nothing to
draw and the figure says so.
"""

from __future__ import annotations

from collections import Counter

import matplotlib
from matplotlib.figure import Figure

from servetune.report.campaign import CampaignView, level_axis
from servetune.report.curves import curve_caption, invalid_legend, mark_ceiling, per_instant, plot_series
from servetune.report.evidence import curve_levels
from servetune.report.figure_base import ReportFigure, _png, trial_label

METHODS = {"counter": "NVML's total-energy counter", "power_curve": "the integrated NVML power curve",
           "modelled": "the simulator's power model (not a measurement)"}


def energy_figure(campaign: CampaignView) -> ReportFigure:
    key, title = "energy", "Energy per output token vs load, and GPU power during each trial"
    methods = Counter(t.summary.energy_method for t in campaign.trials if t.summary.energy_j is not None)
    how = "; ".join(f"{n} trial(s) from {METHODS.get(m or '', m)}" for m, n in sorted(methods.items(), key=str))
    levels = curve_levels(campaign)
    ceiling, _ = campaign.ceiling()
    caption = curve_caption(levels, "Left: joules per output token over each trial's steady window (all GPUs), "
                                    "and the mean power. Right: power (W, summed over the trial's GPUs) against "
                                    f"time since the trial's t0. Energy from {how or 'no trial'}.")
    trials = [t for t in campaign.trials if t.stage != "correctness"]
    curves = [(t, *per_instant(t.gpu.get("samples") or [], "power_w")) for t in trials]
    curves = [c for c in curves if c[1]]
    if not methods and not curves:
        return ReportFigure(key, title, caption, None, "no power readings in any trial")
    fig = Figure(figsize=(11, 4.2))
    ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"wspace": 0.4})  # room for the left panel's second axis
    hollow = plot_series(ax1, levels, lambda s: s.energy_per_output_token_j, "o-", "J / output token", "#d95f0e")
    mark_ceiling(ax1, ceiling)
    invalid_legend(ax1, hollow)
    ax1.set(xlabel=level_axis(campaign.trials), ylabel="joules per output token", title="energy per token")
    watts = ax1.twinx()
    plot_series(watts, levels, lambda s: s.gpu_power_window_mean_w, "s:", "mean power (W)", "#636363")
    watts.set_ylabel("mean power (W)")
    watts.set_ylim(bottom=0)
    cmap = matplotlib.colormaps["viridis"]
    for i, (t, times, power) in enumerate(curves):
        ax2.plot(times, power, color=cmap(i / max(1, len(curves) - 1)), linewidth=1.0, label=trial_label(t))
    limits = [sum(float(d.get("power_limit_w") or 0) for d in t.gpu.get("devices") or []) for t, _, _ in curves]
    if limits and max(limits) > 0:
        ax2.axhline(max(limits), color="#c0392b", linestyle=":", label=f"board limit {max(limits):.0f} W")
    ax2.set(xlabel="time since trial start (s)", ylabel="power (W)", title="GPU power")
    for ax in (ax1, ax2):
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=8, loc="upper right")
    if watts.get_legend_handles_labels()[0]:  # no mean power on any level: no empty legend
        watts.legend(fontsize=8, loc="lower left")
    ax2.legend(fontsize=7, ncol=2 if len(curves) > 8 else 1, loc="lower right")
    return ReportFigure(key, title, caption, _png(fig))


__all__ = ["energy_figure"]
