"""The plan's optional sections: repeats, robustness, dry-run profiles and the objective.

The objective says which passing level and config the campaign recommends; the SLA is always a constraint
and never traded: ``goodput`` (requests/s inside the SLA), ``goodput_per_watt`` (good requests per joule:
goodput over the window's mean GPU power) or ``cost_per_mtok`` (the fewest dollars per million output
tokens at the plan's ``cost``). Ties are ties, as for goodput (servetune.tuning.objective).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from servetune.numbers import Int, Number, Strict as _Strict

Objective = Literal["goodput", "goodput_per_watt", "cost_per_mtok"]


class RepeatsSection(_Strict):
    """Repeats of the trials that decide something (the ceiling's last pass and first fail, a refinement
    winner and the config it replaces), each with its own workload seed."""

    count: Int | None = Field(default=None, ge=1, le=20,
                              description="repeats per decisive trial; default 3 on live engines, 1 in virtual time")
    max: Int = Field(default=5, ge=1, le=30,
                     description="a marginal level (its SLA verdict flips) gets up to this many")
    invalid_retries: Int = Field(default=1, ge=0, le=5,
                                 description="an INVALID trial is re-run this many times, resized from its own rate")
    crash_retries: Int = Field(default=2, ge=0, le=5,
                               description="a trial the engine died under is re-run this many times on a restarted"
                                           " engine; then the level is a fault (never a capacity verdict)")
    clear_margin: Number | None = Field(
        default=None, gt=0, lt=1,
        description="adaptive repeats: a verdict this far from the SLA's edge is settled on one seed (a pass whose"
                    " p99s' 95% intervals stay under this fraction of their bounds; a failure beyond the bounds"
                    " divided by it); None: every walk level gets its seeds")

    @model_validator(mode="after")
    def _max_at_least_count(self) -> RepeatsSection:
        if self.count is not None and self.max < self.count:
            raise ValueError(f"max ({self.max}) must be >= count ({self.count})")
        return self


class PredictSection(_Strict):
    """The calibrated simulator in the loop (servetune.tuning.predict): a refinement candidate the simulator,
    calibrated on the campaign's own trials, predicts clearly worse than the incumbent is not measured."""

    max_error: Number = Field(default=0.10, gt=0, lt=1, description="abstain (measure every candidate) when the"
                                                                    " calibration's held-out error is above this")
    min_trials: Int = Field(default=3, ge=2, le=50, description="measured trials at the base flags it needs")


class RobustnessSection(_Strict):
    """The answer re-measured under gamma bursts at ``fractions`` of the rate it serves
    (servetune.tuning.robustness)."""

    burstiness: Number = Field(default=0.5, gt=0, description="gamma shape of the arrivals: < 1 burstier")
    fractions: list[Number] = Field(default_factory=lambda: [0.8, 1.0], min_length=1,
                                    description="of the rate the chosen config serves")

    @field_validator("fractions")
    @classmethod
    def _sane(cls, v: list[float]) -> list[float]:
        if any(not 0 < x <= 2 for x in v) or v != sorted(set(v)):
            raise ValueError(f"fractions must be increasing, each in (0, 2], got {v}")
        return v


class SimEstimate(_Strict):
    """Profiles for estimating a real campaign with the simulator (``servetune tune --dry-run``)."""

    gpu: str = "A100-80G"
    model: str = "llama-8b"
