"""A plan's ``load`` section, and the checks that need the workload too (timed traces).

``servetune.plan`` re-exports ``LoadSection``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from servetune.numbers import Number, Streams

if TYPE_CHECKING:
    from servetune.workload.spec import WorkloadSpec


class LoadSection(BaseModel):
    """How every trial offers its load: ``concurrency`` (closed loop, levels are streams) or ``rate`` (open
    loop, levels are requests/s by ``arrival``, gamma of shape ``burstiness``; ``max_in_flight`` at once).
    ``arrival: trace`` replays the workload's timed trace, rescaled to each level's rate."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # numbers: servetune.numbers

    mode: Literal["concurrency", "rate"] = "concurrency"
    arrival: Literal["poisson", "gamma", "constant", "trace"] = "poisson"
    burstiness: Number = Field(default=1.0, gt=0, description="gamma shape (arrival: gamma): < 1 burstier")
    max_in_flight: Streams = Field(default=1024, description="rate mode: the client's cap on requests in flight")

    def arrivals_text(self) -> str:  # "poisson arrivals", "gamma arrivals (burstiness 0.5)"
        return f"{self.arrival} arrivals" + (f" (burstiness {self.burstiness:g})" if self.arrival == "gamma" else "")

    @model_validator(mode="after")
    def _burstiness_for_gamma(self) -> LoadSection:
        if self.burstiness != 1.0 and self.arrival != "gamma":
            raise ValueError(f"burstiness applies to arrival: gamma, not {self.arrival}")
        if self.arrival == "trace" and self.mode != "rate":
            raise ValueError("arrival: trace times an open loop: it needs mode: rate")
        return self


def check_trace(load: LoadSection | None, workload: WorkloadSpec) -> None:
    """``arrival: trace`` needs a workload with a trace, and a trace replays single requests: one line if not."""
    if load is not None and load.arrival == "trace" and workload.trace is None:
        raise ValueError("load.arrival: trace arrivals need a timed trace: give the workload a trace section"
                         " (workload.trace.path), or use poisson, gamma or constant")
    if workload.trace is not None and workload.multi_turn is not None:
        raise ValueError("workload.trace: a trace replays single requests, not conversations (remove multi_turn)")
