"""Drawing a figure's curves against the load level: each level's mean over its VALID repeats with its 95%
interval, the INVALID trials hollow beside it, and the ceiling; shared by every level figure."""

from __future__ import annotations

from servetune.report.evidence import Getter, Level, series


def mark_ceiling(ax, ceiling: int | None) -> None:
    if ceiling is not None:
        ax.axvline(ceiling, color="#c0392b", linestyle="--", linewidth=1.4, label=f"ceiling c={ceiling}")


INVALID_STYLE = {"linestyle": "none", "marker": "o", "markersize": 7, "markerfacecolor": "none",
                 "markeredgecolor": "#969696", "markeredgewidth": 1.3}
CURVE_NOTE = ("Points: the mean over each level's VALID repeats of the main server config, error bars the 95% "
              "CI of that mean (Student t, when a level has 2 or more repeats); hollow grey circles: INVALID "
              "trials (servetune.validity), drawn where they measured but excluded from the mean, the ceiling "
              "and every decision.")


def plot_series(ax, levels: list[Level], get: Getter, fmt: str, label: str, color: str) -> bool:
    """The mean line with its CI bars, and the INVALID values hollow beside it; True if any were INVALID."""
    line = series(levels, get)
    if line.xs:
        ax.errorbar(line.xs, line.means, yerr=line.ci95 if line.any_interval else None, fmt=fmt, label=label,
                    color=color, capsize=3, elinewidth=1)
    if line.invalid_xs:
        ax.plot(line.invalid_xs, line.invalid_ys, **INVALID_STYLE)
    return bool(line.invalid_xs)


def invalid_legend(ax, shown: bool) -> None:
    if shown:
        ax.plot([], [], label="INVALID (not used)", **INVALID_STYLE)


def curve_caption(levels: list[Level], text: str) -> str:
    repeats = max((len(lv.used) for lv in levels), default=0)
    invalid = sum(len(lv.invalid) for lv in levels)
    counted = f" Up to {repeats} repeats per level; {invalid} INVALID trial(s) not used." if levels else ""
    return f"{text} {CURVE_NOTE}{counted}"


def per_instant(samples: list[dict], field: str) -> tuple[list[float], list[float]]:
    """A GPU sample field summed over the trial's GPUs at each sampling instant (instants without it skipped)."""
    by_time: dict[float, float] = {}
    for smp in samples:
        if smp.get(field) is not None:
            ts = round(float(smp["t_s"]), 3)
            by_time[ts] = by_time.get(ts, 0.0) + float(smp[field])
    times = sorted(by_time)
    return times, [by_time[t] for t in times]
