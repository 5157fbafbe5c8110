"""The plan's stages (docs/tuning.md: correctness, baseline, ramp, refinement), its GPU budget and its validity
section: what each step of a campaign may do, checked before any server starts."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from servetune.engines.knobs import FlagValue
from servetune.numbers import (
    MAX_GRID_VALUES,
    MAX_LIST,
    Int,
    Number,
    RampLevel,
    Rate,
    Requests,
    Streams,
    Strict as _Strict,
    Warmup,
)
from servetune.plan.sections import PredictSection
from servetune.validity import ValidityRules


class CorrectnessStage(_Strict):
    """Step 1: one request must come back with sane output; idle GPU memory and resolved args recorded."""

    enabled: bool = True
    requests: Int = Field(default=2, ge=1, le=64)


Level = int | float  # streams (concurrency mode) or requests/s (rate mode)


class BaselineStage(_Strict):
    """Step 2: a low-concurrency run whose figures are the reference for everything after."""

    concurrency: Streams = 8
    rate: Rate | None = Field(default=None,
                              description="rate mode: the baseline's requests/s (default: half the first ramp level)")
    requests: Requests = Field(default=200,
                               description="measured requests after warm-up: a floor (servetune.tuning.sizing)")
    warmup: Warmup = 16
    duration_s: Number | None = Field(default=None, gt=0,
                                      description="steady window to aim for (>= validation.min_window_s)")


class RampStage(_Strict):
    """Steps 3-4: raise concurrency level by level until the SLA, memory or errors break, or gains stall."""

    levels: list[RampLevel] = Field(default_factory=lambda: [16, 32, 48, 64, 96, 128], min_length=1,
                                    max_length=MAX_LIST,
                                    description="streams (load.mode concurrency) or requests/s (rate)")
    requests: Requests = Field(default=200, description="measured requests per level after warm-up: a floor")
    warmup: Warmup = 16
    duration_s: Number | None = Field(default=None, gt=0,
                                      description="steady window to aim for (>= validation.min_window_s)")
    min_gain: Number = Field(default=0.05, ge=0, le=1,
                             description="a level gaining less goodput (beyond the noise) is a plateau")
    bisect: bool = Field(default=True, description="bisect between the last passing and first failing level")
    bisect_min_step: Int = Field(default=4, ge=1, description="stop bisecting when the gap is this small")
    rate_step: Number = Field(default=0.025, gt=0, le=0.5,
                              description="rate mode: stop bisecting when the gap is this fraction of the failing rate"
                                          " (the capacity's resolution)")

    @field_validator("levels")
    @classmethod
    def _increasing(cls, v: list[int | float]) -> list[int | float]:
        if any(x <= 0 for x in v):
            raise ValueError("levels must be positive")
        if any(b <= a for a, b in zip(v, v[1:], strict=False)):
            raise ValueError(f"levels must be strictly increasing, got {v}")
        return v


class RefineStage(_Strict):
    """Step 5: tune server flags near the ceiling; every server-side change restarts the server.

    ``grid`` lists the candidate values per flag, searched in the given order (the article's
    order: radix cache first, then chunked prefill, then scheduling, then max-running). The
    search walks one flag at a time from the incumbent, in the direction the server signals
    suggest, and stops when a step no longer helps: it never runs the whole grid
    (bench/tuning_efficiency.py measures what that saves).
    """

    enabled: bool = True
    radix_cache: bool = Field(default=True, description="turn the prefix cache on first (drop disable-radix-cache)")
    shared_prefix_policies: list[str] = Field(
        default_factory=list,
        description="schedule policies tried in the radix step when the workload shares prefixes, e.g. [lpm]",
    )
    grid: dict[str, list[FlagValue]] | None = Field(
        default=None, description="flag -> values, walked in order; default: the engine's own (EngineBase.tuning)")
    set_max_running: bool = Field(default=True, description="try the engine's running-request cap = the level last")
    max_running_flag: str | None = Field(default=None, description="default: the engine's (SGLang"
                                                                   " max-running-requests, vLLM max-num-seqs)")
    extend_levels: Int = Field(default=2, ge=0, description="levels above the ceiling tried with the tuned config")
    min_improvement: Number = Field(
        default=0.02, ge=0, le=1, description="gain a change needs to be kept, and it must exceed the noise too")
    requests: Requests | None = Field(default=None, description="default: ramp.requests")
    warmup: Warmup | None = Field(default=None, description="default: ramp.warmup")
    predict: PredictSection | None = Field(default=None, description="skip candidates the calibrated simulator"
                                                                     " rules out (servetune.tuning.predict)")

    @field_validator("grid")
    @classmethod
    def _non_empty_values(cls, v: dict[str, list[FlagValue]] | None) -> dict[str, list[FlagValue]] | None:
        if v is None:
            return v
        if (n := sum(map(len, v.values()))) > MAX_GRID_VALUES:  # the walk and its dry run grow with the grid
            raise ValueError(f"{n} values in all; a grid has at most {MAX_GRID_VALUES}")
        for flag, values in v.items():
            if len(values) > MAX_LIST:
                raise ValueError(f"{flag}: {len(values)} values; at most {MAX_LIST} a flag")
            if flag.startswith("-"):
                raise ValueError(f"write flag names without leading dashes: {flag!r}")
            if not values:
                raise ValueError(f"{flag}: give at least one value")
            if len(set(map(str, values))) != len(values):
                raise ValueError(f"{flag}: duplicate values {values}")
        return v


class Stages(_Strict):
    correctness: CorrectnessStage = Field(default_factory=CorrectnessStage)
    baseline: BaselineStage = Field(default_factory=BaselineStage)
    ramp: RampStage = Field(default_factory=RampStage)
    refine: RefineStage = Field(default_factory=RefineStage)


class Budget(_Strict):
    """The campaign stops (and recommends from what it has) once this much GPU time is spent."""

    max_gpu_minutes: Number = Field(default=240.0, gt=0)
    restart_cost_s: Number = Field(default=60.0, ge=0, description="GPU time charged per server (re)start until"
                                   " the campaign has measured its own (then the mean of its measured start-ups)")
    warmup_after_start: Requests | None = Field(
        default=None, description="requests at the first trial's load, unmeasured, after each server start: the"
                                  " engine's JIT compiles and first-use costs land there, not in a measured window")
    max_requests_per_trial: Requests = Field(default=20000, description="cap on a trial sized to be valid")


class ValidationSection(ValidityRules):
    """How this plan's trials are judged: the validity rules (servetune.validity) and the checklist."""

    min_measured: Requests = Field(default=200, description="fewer measured requests: the trial is rejected")
    waive: list[Literal["gpu_memory_curve", "clean_gpu", "energy"]] = Field(
        default_factory=list, description="checklist items this runner cannot satisfy (e.g. a CPU-only engine)")

    def rules(self) -> ValidityRules:
        return ValidityRules(**{k: getattr(self, k) for k in ValidityRules.model_fields})
