"""TuningPlan: everything one tuning campaign needs, checked before any server starts.

A plan names the model, how to start the engine and where (runner), the workload, the SLA, the
stages of the protocol (docs/tuning.md) and a GPU budget.
A bad plan is rejected with the dotted path of the bad field (``stages.ramp.levels: ...``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from servetune.energy import Cost
from servetune.engines import EngineConfig, engine_class
from servetune.engines.knobs import KnobError, engine_flags, with_flags
from servetune.numbers import MAX_NAME, Int, Label, Strict as _Strict, check_protocol_sizes
from servetune.plan.load_section import LoadSection, check_trace
from servetune.plan.modality import check_modality
from servetune.plan.protocols import MeasurementProtocol, check_protocols
from servetune.plan.sections import Objective, RepeatsSection, RobustnessSection, SimEstimate
from servetune.plan.stages import Budget, Level, Stages, ValidationSection
from servetune.runners import LocalRunnerConfig, RunnerConfig
from servetune.sla import SLA
from servetune.workload.spec import WorkloadSpec


class TuningPlan(_Strict):
    """One campaign: what to tune, under which SLA, in which stages, within which budget."""

    name: Label = Field(min_length=1, description="a label (it names the campaign's folder): printable, no '/',"
                                                 f" at most {MAX_NAME} characters")
    model: str = Field(min_length=1, description="model path or id (the engine's model unless it names its own)")
    engine: EngineConfig = Field(description="servetune.engines: kind sglang | vllm | sim | transformers | external"
                                 " and its settings (servetune.engines.registry)")
    runner: RunnerConfig = Field(default_factory=lambda: LocalRunnerConfig(), description="servetune.runners")
    endpoint: Literal["chat", "completions", "generate"] = "chat"
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec)
    load: LoadSection | None = Field(default=None, description="closed-loop streams (default) or open-loop rates")
    sla: SLA
    stages: Stages = Field(default_factory=Stages)
    budget: Budget = Field(default_factory=Budget)
    validation: ValidationSection = Field(default_factory=ValidationSection)
    repeats: RepeatsSection = Field(default_factory=RepeatsSection)
    on_trial_failure: Literal["continue", "stop"] = Field(
        default="continue", description="a failed trial counts as a failing level (continue) or ends the run"
    )
    estimate: SimEstimate | None = Field(default=None, description="sim profiles for --dry-run estimates")
    robustness: RobustnessSection | None = Field(default=None, description="re-measure the answer under bursts")
    protocols: list[MeasurementProtocol] = Field(  # left out of dumps when empty: older plan digests hold
        default_factory=list, exclude_if=lambda v: not v,
        description="other ways to measure the same server, run once beside the campaign (servetune.plan.protocols)")
    prompt_template: str | None = Field(
        default=None, description="template file or model dir whose chat template the answer depends on (fingerprinted)"
    )
    seed: Int = 0
    cost: Cost | None = Field(default=None, exclude_if=lambda v: v is None,  # older plan digests hold
                              description="the GPU price: every trial gets $ per million tokens and per 1,000 good"
                                          " requests")
    warm_start: bool = Field(default=False, exclude_if=lambda v: not v,  # older plan digests hold
                             description="begin from the last accepted answer for the same service (a weekly or"
                                         " on-change run): confirm it on every seed, then search around it; the full"
                                         " walk when it fails or the service changed (servetune.tuning.warm)")
    objective: Objective = Field(default="goodput", exclude_if=lambda v: v == "goodput",
                                 description="what the answer maximises under the SLA (servetune.plan.sections)")

    @model_validator(mode="before")
    @classmethod
    def _engine_model_from_plan(cls, data: Any) -> Any:
        """``engine.model`` defaults to the plan's ``model`` (sglang, vllm, transformers: ``model_from_plan``),
        so it is written once."""
        if isinstance(data, dict):
            engine = data.get("engine", {"kind": "sglang"})
            cls = engine_class(engine.get("kind", "sglang")) if isinstance(engine, dict) else None
            if cls is not None and cls.model_from_plan and "model" not in engine:
                engine = {"kind": "sglang", **engine, "model": data.get("model")}
            data = {**data, "engine": engine}
        return data

    @field_validator("sla")
    @classmethod
    def _sla_has_a_p99_bound(cls, v: SLA) -> SLA:
        if v.p99_ttft_ms is None and v.p99_tpot_ms is None and v.p99_e2e_ms is None:
            raise ValueError("set at least one of p99_ttft_ms, p99_tpot_ms, p99_e2e_ms")
        return v

    @model_validator(mode="after")
    def _gpus_fit_the_engine(self) -> TuningPlan:
        """A runner that names its GPUs must name as many as the engine occupies (tp x dp for SGLang)."""
        need, gpus = self.engine.gpus_needed(), getattr(self.runner, "gpus", None)
        have = len(gpus) if isinstance(gpus, list) else gpus
        if need is not None and have is not None and have != need:
            raise ValueError(f"runner.gpus: {have} GPU(s) for an engine that occupies {need}"
                             " (tp-size x dp-size): list one per rank")
        return self

    @model_validator(mode="after")
    def _objective_has_its_inputs(self) -> TuningPlan:
        if self.objective == "cost_per_mtok" and self.cost is None:
            raise ValueError("objective cost_per_mtok needs cost.gpu_hour_usd")
        return self

    @model_validator(mode="after")
    def _protocols_fit(self) -> TuningPlan:
        check_protocol_sizes(self.protocols)
        check_protocols(self.protocols, self.workload, self.engine, self.engine_flags())
        return self

    @model_validator(mode="after")
    def _workload_fits_load_and_model(self) -> TuningPlan:
        check_trace(self.load, self.workload)
        check_modality(self.engine, self.workload)
        return self

    @model_validator(mode="after")
    def _levels_fit_the_mode(self) -> TuningPlan:
        levels = self.stages.ramp.levels
        if self.rate_mode:
            if levels[0] <= self.baseline_level:
                raise ValueError(f"stages: ramp.levels must start above baseline.rate"
                                 f" ({self.baseline_level:g} req/s), got {levels[0]:g}")
            return self
        if self.stages.baseline.rate is not None:
            raise ValueError("stages.baseline.rate: only for load.mode rate (the baseline here is"
                             " stages.baseline.concurrency)")
        if levels[0] <= self.stages.baseline.concurrency:
            raise ValueError(f"stages: ramp.levels must start above baseline.concurrency"
                             f" ({self.stages.baseline.concurrency}), got {levels[0]}")
        if any(float(x) != int(x) for x in levels):
            raise ValueError(f"stages.ramp.levels: streams must be whole numbers in concurrency mode, got {levels}"
                             " (request rates need load.mode: rate)")
        self.stages.ramp.levels = [int(x) for x in levels]
        return self

    @property
    def rate_mode(self) -> bool:
        """Open-loop trials: the levels are requests/s."""
        return self.load is not None and self.load.mode == "rate"

    @property
    def baseline_level(self) -> Level:
        if not self.rate_mode:
            return self.stages.baseline.concurrency
        return self.stages.baseline.rate or self.stages.ramp.levels[0] / 2

    @property
    def level_unit(self) -> str:
        return "req/s" if self.rate_mode else "streams"

    def level_text(self, level: Level | None) -> str:
        """``concurrency 64`` or ``12.5 req/s``: a level as a reader should see it."""
        return "-" if level is None else f"{level:g} req/s" if self.rate_mode else f"concurrency {level}"

    def load_at(self, level: Level) -> dict[str, Any]:
        """A trial's load fields at ``level``: the streams, or the rate and the in-flight cap."""
        if self.rate_mode:
            assert self.load is not None
            return {"concurrency": self.load.max_in_flight, "rate": float(level)}
        return {"concurrency": int(level)}

    @model_validator(mode="after")
    def _tunable(self) -> TuningPlan:
        r, knobs = self.stages.refine, type(self.engine).tuning
        if r.grid is None:  # the engine's own knobs: tuning never names an engine's flag
            r.grid = {k: list(v) for k, v in knobs.grid.items()}
        if r.max_running_flag is None:
            r.max_running_flag = knobs.max_running
        if not self.engine.launches and r.enabled:
            raise ValueError(f"stages.refine.enabled: an {self.engine.kind} engine cannot be restarted with new flags")
        if not r.enabled:
            return self
        if r.set_max_running and r.max_running_flag is None:
            raise ValueError(f"stages.refine.set_max_running: the {self.engine.kind} engine has no flag capping"
                             " running requests; name one in max_running_flag or set set_max_running: false")
        # every grid value, through the engine's own checks (the catalogue's types, bounds and choices):
        # a value the engine would refuse fails here, not on a GPU halfway through the campaign
        tries = [(f"stages.refine.grid.{flag}[{i}]", {flag: value})
                 for flag, values in r.grid.items() for i, value in enumerate(values)]
        if r.set_max_running:
            tries.append(("stages.refine.max_running_flag", {r.max_running_flag: 8}))
        for where, change in tries:
            try:
                with_flags(self.engine, {**self.engine_flags(), **change})
            except (KnobError, ValueError) as exc:
                raise ValueError(f"{where}: the {self.engine.kind} engine refuses it: {_first_line(exc)}") from None
        return self

    def engine_flags(self) -> dict[str, Any]:
        """The engine's server-side flags as the tuning walk sees them (servetune.engines.knobs)."""
        return engine_flags(self.engine)

    def refine_requests(self) -> tuple[int, int]:
        r = self.stages.refine
        return (r.requests or self.stages.ramp.requests, self.stages.ramp.warmup if r.warmup is None else r.warmup)

    def with_repeats(self, default: int) -> TuningPlan:
        """The plan with ``repeats.count`` resolved (the runner's default when the plan leaves it unset)."""
        if self.repeats.count is not None:
            return self
        count = min(default, self.repeats.max)
        return self.model_copy(update={"repeats": self.repeats.model_copy(update={"count": count})})

    @property
    def repeat_count(self) -> int:
        return self.repeats.count or 1


def _first_line(exc: Exception) -> str:
    text = str(exc)
    if isinstance(exc, ValidationError):
        text = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
    return text.splitlines()[0] if text else type(exc).__name__
