"""One line per trial start and end: what `servetune tune` prints and an Airflow task logs, word for word.

The line is plain text in parts (head, body, mark) with a tone for the mark, so a terminal can colour
the verdict and a log keeps it as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # the CLI imports fmt_s at start-up; the campaign's modules load when a line is made
    from servetune.plan import TuningPlan
    from servetune.tuning.campaign import Progress
    from servetune.tuning.state import CampaignState

Tone = Literal["info", "good", "warn", "bad"]


@dataclass
class TrialLine:
    head: str  # "#3 of <= 40 ramp        level   32"
    body: str  # start: why and the GPU time; end: goodput, p99s, GPU seconds
    mark: str = ""  # end: "pass", "fail: <reasons>", "failed: <reason>", "sane output"
    tone: Tone = "info"

    def __str__(self) -> str:
        return "  ".join(part for part in (self.head, self.body, self.mark) if part)


def fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def trial_line(plan: TuningPlan, p: Progress, state: CampaignState | None = None) -> TrialLine:
    """The line for one progress event; ``state`` (the campaign's so far) adds "of <= N" to a start."""
    from servetune.tuning.costs import remaining_trials_upper_bound
    from servetune.tuning.decisions import correctness_ok
    from servetune.tuning.verdict import judge

    s = p.spec
    level = f"{s.rate:>6g} req/s" if s.rate is not None else f"{s.concurrency:>4}"
    head = f"#{p.index} {s.stage:<11} level {level}"
    if s.stage == "protocol":  # run once before the campaign, outside its count
        head = f"{s.protocol or '?'} protocol    level {level}"
    elif state is not None and p.event == "start":  # the walk usually stops before the bound
        most = max(p.index, p.index - 1 + remaining_trials_upper_bound(plan, state, s.stage))
        head = f"#{p.index} of <= {most} {s.stage:<11} level {level}"
    if p.event == "start":
        return TrialLine(head, f"start  ({s.reason})  GPU so far {fmt_s(p.spent_s)}, ETA <= {fmt_s(p.eta_s)}")
    o = p.outcome
    assert o is not None
    if o.status == "failed":
        return TrialLine(head, "", f"failed: {o.failure_reason or '?'}", "bad")
    sm = o.summary
    body = (f"goodput {sm.goodput_rps or 0:.2f} req/s, p99 TTFT {sm.ttft_ms.p99 or 0:.0f} ms,"
            f" p99 TPOT {sm.tpot_ms.p99 or 0:.1f} ms, {o.gpu_seconds:.0f} s GPU")
    if o.stage == "correctness":  # sane output, not a measurement: no window to judge
        ok, why = correctness_ok(o)
        return TrialLine(head, body, "sane output" if ok else f"fail: {why}", "good" if ok else "bad")
    verdict = judge(o, plan.sla)
    if verdict.passed:
        return TrialLine(head, body, "pass", "good")
    return TrialLine(head, body, "fail: " + "; ".join(verdict.reasons), "warn")


def line_printer(plan: TuningPlan, emit: Callable[[TrialLine], None],
                 state_of: Callable[[], CampaignState] | None = None) -> Callable[[Progress], None]:
    """A ``Campaign(progress=...)`` callback that hands each event's line to ``emit``."""

    def show(p: Progress) -> None:
        emit(trial_line(plan, p, state_of() if state_of is not None else None))

    return show


__all__ = ["TrialLine", "fmt_s", "line_printer", "trial_line"]
