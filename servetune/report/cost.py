"""What an answer cost in GPU time, for the report: a team tuning weekly on a shared GPU window decides from
this whether the answer was worth it and what the next run may spend.

The figures are the campaign's own: ``gpu_seconds`` from experiment.json (every trial, server start-ups
included; the plan's protocols apart), the server starts and the start-ups' seconds from state.json
(``servetune.warehouse.files.spending``); from the warehouse, the experiments columns of the same names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servetune.report.campaign import CampaignView, simulated_mark
from servetune.telemetry import startup_log


@dataclass(frozen=True)
class AnswerCost:
    gpu_seconds: float
    trials: int  # the campaign's trials (protocols apart, as in gpu_seconds)
    server_starts: int | None = None
    startup_seconds: float | None = None
    protocols_gpu_seconds: float | None = None
    first_start: str = ""  # where the first server start went, by the engine's log (servetune.telemetry.startup_log)
    simulated: str = ""  # " (simulated)": virtual time, not a GPU's

    @property
    def minutes(self) -> float:
        return self.gpu_seconds / 60.0

    def text(self, *, answered: bool = True) -> str:
        """'answer bought with 14.2 GPU min over 21 trials, 9 server starts (1.3 GPU min of start-ups)'."""
        lead = "answer bought with" if answered else "no answer, for"
        plural = "s" if self.trials != 1 else ""
        parts = [f"{lead} {self.minutes:,.1f} GPU min{self.simulated} over {self.trials} trial{plural}"]
        if self.server_starts is not None:
            starts = f"{self.server_starts} server start{'s' if self.server_starts != 1 else ''}"
            if self.startup_seconds is not None and self.server_starts:
                starts += f" ({self.startup_seconds / 60:,.1f} GPU min of start-ups)"
            parts.append(starts)
        text = ", ".join(parts)
        if self.protocols_gpu_seconds:
            text += f"; the protocols before it took {self.protocols_gpu_seconds / 60:,.1f} GPU min more"
        if self.first_start:
            text += f"; the first start, by the engine's log: {self.first_start}"
        return text


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _first_start(campaign: CampaignView) -> str:
    """Where the campaign's first logged server start went (the trial that started it keeps its phases)."""
    for trial in campaign.trials:
        phases = (trial.server or {}).get("startup")
        if isinstance(phases, dict) and (text := startup_log.summary(phases)):
            return text
    return ""


def answer_cost(campaign: CampaignView) -> AnswerCost | None:
    """The campaign's GPU time, trials and starts; None where it states no GPU time (a lone bench trial,
    a campaign written before the figure was kept)."""
    exp = campaign.experiment
    seconds = _number(exp.get("gpu_seconds"))
    if seconds is None:
        return None
    trials = [t for t in campaign.trials if t.stage != "protocol"]
    starts = _number(exp.get("server_starts"))
    return AnswerCost(gpu_seconds=seconds, trials=len(trials), server_starts=None if starts is None else int(starts),
                      startup_seconds=_number(exp.get("startup_gpu_seconds")),
                      protocols_gpu_seconds=_number(exp.get("protocols_gpu_seconds")),
                      first_start=_first_start(campaign),
                      simulated=" (simulated)" if simulated_mark(trials) == " (simulated)" else "")
