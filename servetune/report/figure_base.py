"""What every report figure is and how it becomes PNG bytes: shared by the figures (servetune.report.figures)
and the scheduler's figure (servetune.report.scheduler), so neither imports the other's module."""

from __future__ import annotations

import io
from dataclasses import dataclass

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from servetune.report.campaign import flag_value, level_of
from servetune.result import TrialResult

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
    c = level_of(t)
    if c is not None:
        parts.append(f"c={c}")
    cfg = t.server_config
    if t.stage == "refine":
        for key, short in (("chunked_prefill_size", "chunk"), ("schedule_conservativeness", "cons"),
                           ("max_running_requests", "mrr")):
            if flag_value(cfg, key) is not None:
                parts.append(f"{short}={flag_value(cfg, key)}")
    return " ".join(parts)
