"""The refinement heatmap: goodput for each chunked-prefill-size x schedule-conservativeness tried.

A cell stands for one server config at one level, never a pool of levels: a closed loop's goodput is
capped by its level, so a mean over 48 and 64 streams is a figure no trial measured. The recommended
cell shows the recommendation's own config and level; any other cell its best config and level that
met the SLA (or, when none did, its best one, marked "missed SLA"). Each cell names its level, and an
axis value the flag left to the engine names the value the engine chose (from its server info).
"""

from __future__ import annotations

import math
from typing import Any

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from servetune.report.campaign import CampaignView, config_key, counts, flag_value, is_invalid, level_of, meets_sla
from servetune.report.figure_base import ReportFigure, _png
from servetune.result import TrialResult
from servetune.stats import spread

DEFAULT = "default"  # a flag the trial left to the engine's default
AXES = ("chunked_prefill_size", "schedule_conservativeness")
CAPTION = ("Goodput (req/s) near the ceiling for each chunked-prefill-size x schedule-conservativeness tried; "
           "'default' is the engine's own value, with the value it chose where its server info says (the "
           "refinement changes one flag at a time, and the ramp's trials are the default/default cell). A cell "
           "is one server config at one level (c=...): the mean goodput over its VALID repeats (n=...), never a "
           "pool of levels. The recommended cell (outlined in red) shows the recommendation's config and level; "
           "another cell its best config and level that met the p99 SLA on most repeats, or its best one marked "
           "'missed SLA' when none did; 'INVALID': none of its trials was valid. Hatched: not measured.")


def _axis_key(value: Any) -> tuple[int, float | str]:
    return (0, 0.0) if value == DEFAULT else (1, value if isinstance(value, int | float) else str(value))


def cell_of(t: TrialResult) -> tuple[Any, Any]:
    return tuple(DEFAULT if (v := flag_value(t.server_config, a)) is None else v for a in AXES)  # type: ignore[return-value]


def cell_value(group: list[TrialResult], sla: dict[str, float]) -> tuple[float, str]:
    """One config at one level: mean goodput over its counted repeats (a rejected trial counts as 0), and a note.

    The note says "missed SLA" when most counted repeats missed it, "INVALID" when none counted."""
    used = [t for t in group if counts(t)]
    if not used:
        return 0.0, "\nINVALID" if any(is_invalid(t) for t in group) else "\nfailed"
    mean = spread([(t.summary.goodput_rps or 0.0) if t.status == "ok" else 0.0 for t in used]).mean or 0.0
    passes = sum(meets_sla(t, sla) for t in used)
    note = (f" (n={len(used)})" if len(used) > 1 else "") + ("" if passes * 2 > len(used) else "\nmissed SLA")
    return mean, note


def engine_default(trials: list[TrialResult], axis: str) -> Any:
    """The value the engine chose for a flag left to it, from a trial's server info (None when unknown)."""
    for t in trials:
        if flag_value(t.server_config, axis) is None:
            value = ((t.server or {}).get("server_info") or {}).get(axis)
            if isinstance(value, int | float) and not isinstance(value, bool):
                return value
    return None


def _tick(value: Any, chosen: Any) -> str:
    if value != DEFAULT:
        return f"{value:g}" if isinstance(value, float) else str(value)
    return DEFAULT if chosen is None else f"default\n({chosen:g})"


def choose_cells(trials: list[TrialResult], sla: dict[str, float], rec: dict[str, Any] | None,
                 ) -> dict[tuple[Any, Any], tuple[float, str, Any, bool]]:
    """Each cell's (goodput, note, level, is the recommendation) from its (config, level) groups."""
    groups: dict[tuple[Any, str, Any], list[TrialResult]] = {}
    for t in trials:
        groups.setdefault((cell_of(t), config_key(t.server_config), level_of(t)), []).append(t)
    rec_key = (config_key((rec or {}).get("config") or {}), (rec or {}).get("rate") or (rec or {}).get("concurrency"))
    best: dict[tuple[Any, Any], tuple[tuple[int, float], float, str, Any, bool]] = {}
    for (cell, cfg, level), group in groups.items():
        value, note = cell_value(group, sla)
        chosen = rec is not None and (cfg, level) == rec_key
        rank = (2 if chosen else 0 if "\n" in note else 1, value)  # the recommendation, then passing, then the rest
        if cell not in best or rank > best[cell][0]:
            best[cell] = (rank, value, note, level, chosen)
    return {cell: (v, note, level, chosen) for cell, (_, v, note, level, chosen) in best.items()}


def refine_heatmap_figure(campaign: CampaignView) -> ReportFigure:
    key, title = "refine_heatmap", "Refinement: chunked-prefill-size x schedule-conservativeness"
    refine = campaign.refine_trials()
    if not refine:
        return ReportFigure(key, title, CAPTION, None, "no refinement trials in this campaign")
    levels = {level_of(t) for t in refine}
    start = [t for t in campaign.curve_trials() if level_of(t) in levels and cell_of(t) == (DEFAULT, DEFAULT)]
    trials = refine + start
    cells = choose_cells(trials, campaign.sla, campaign.recommendation)
    chunks = sorted({c[0] for c in cells}, key=_axis_key)
    conss = sorted({c[1] for c in cells}, key=_axis_key)
    fig = Figure(figsize=(2.4 + 1.4 * len(chunks), 1.8 + 1.0 * len(conss)))
    ax = fig.subplots()
    grid = [[cells[(ch, co)][0] if (ch, co) in cells else math.nan for ch in chunks] for co in conss]
    values = [v for row in grid for v in row if not math.isnan(v)]
    lo, hi = min(values), max(values)
    pad = max(0.02 * abs(hi), 0.1 * (hi - lo), 1e-6)  # near-equal goodputs must not look far apart
    im = ax.imshow(grid, cmap="YlGn", aspect="auto", origin="lower", vmin=lo - pad, vmax=hi + pad)
    unit = "req/s" if any(t.load.get("mode") == "rate" for t in trials) else "c="
    for i, co in enumerate(conss):
        for j, ch in enumerate(chunks):
            if (ch, co) not in cells:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="//", edgecolor="#bdbdbd",
                                       linewidth=0))
                continue
            v, note, level, chosen = cells[(ch, co)]
            at = f"{level:g} req/s" if unit == "req/s" else f"c={level}"
            dark = float(im.norm(v)) > 0.6  # white text only on the dark end of the colour map
            ax.text(j, i, f"{v:.2f} at {at}" + note + ("\nrecommended" if chosen else ""), ha="center",
                    va="center", fontsize=8.5, color="white" if dark else "black")
            if chosen:
                ax.add_patch(Rectangle((j - 0.48, i - 0.48), 0.96, 0.96, fill=False, edgecolor="#c0392b",
                                       linewidth=2.5))
    ax.set_xticks(range(len(chunks)), [_tick(c, engine_default(trials, AXES[0])) for c in chunks])
    ax.set_yticks(range(len(conss)), [_tick(c, engine_default(trials, AXES[1])) for c in conss])
    ax.set(xlabel="--chunked-prefill-size (tokens)", ylabel="--schedule-conservativeness (factor)",
           title="goodput (req/s)")
    cbar = fig.colorbar(im, ax=ax, label="goodput req/s")
    cbar.formatter.set_useOffset(False)
    return ReportFigure(key, title, CAPTION, _png(fig))
