"""TuningPlan: everything one tuning campaign needs, loaded from YAML and checked before any server starts.

A plan names the model, how to start the engine and where (runner), the workload, the SLA, the
stages of the protocol (docs/tuning.md) and a GPU budget.
A bad plan is rejected with the dotted path of the bad field (``stages.ramp.levels: ...``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from servetune.energy import Cost
from servetune.engines import EngineConfig, engine_class
from servetune.engines.knobs import FlagValue, KnobError, engine_flags, with_flags
from servetune.plan_load import LoadSection, check_trace
from servetune.plan_modality import check_modality
from servetune.plan_protocols import MeasurementProtocol, check_protocols
from servetune.plan_sections import Objective, PredictSection, RepeatsSection, RobustnessSection, SimEstimate
from servetune.plan_types import (
    MAX_GRID_VALUES,
    MAX_LIST,
    MAX_NAME,
    Int,
    Label,
    Number,
    RampLevel,
    Rate,
    Requests,
    Streams,
    Strict as _Strict,
    Warmup,
    check_numbers,
    check_protocol_sizes,
    error_text,
)
from servetune.runners import LocalRunnerConfig, RunnerConfig
from servetune.sla import SLA
from servetune.validity import ValidityRules
from servetune.workload.spec import WorkloadSpec


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
        description="other ways to measure the same server, run once beside the campaign (servetune.plan_protocols)")
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
                                 description="what the answer maximises under the SLA (servetune.plan_sections)")

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


class PlanError(ValueError):
    """A plan that cannot run; the message names the file and the path of every bad field."""


def _format_errors(source: str, exc: ValidationError) -> str:
    n = exc.error_count()
    lines = [f"{source}: invalid tuning plan ({n} error{'' if n == 1 else 's'})"]  # then one line per field
    for err in exc.errors():
        loc = ".".join(str(p) or "''" for p in err["loc"] if p != "[key]")  # a bad key: its path names it
        msg = error_text(err)
        lines.append(f"  {loc}: {msg}" if loc else f"  {msg}")  # whole-plan checks name their own path
    return "\n".join(lines)


def parse_plan(data: Any, *, source: str = "plan") -> TuningPlan:
    if data is None:
        raise PlanError(f"{source}: the plan is empty (a plan must be a mapping with name, model and sla)")
    if not isinstance(data, dict):
        raise PlanError(f"{source}: a plan must be a mapping of sections, got a {type(data).__name__}")
    try:
        return check_numbers(data, TuningPlan.model_validate(data))  # and in the sections other modules define
    except ValidationError as exc:
        raise PlanError(_format_errors(source, exc)) from None


def load_plan(path: str | Path) -> TuningPlan:
    """Read a YAML (or JSON) plan; a missing file or a bad field raises PlanError naming it."""
    from servetune.input_files import read_bytes
    from servetune.strict_yaml import YAMLError, load_yaml

    path = Path(path)
    try:
        text = read_bytes(path).decode("utf-8")  # a FIFO or device named as the plan: refused, never read
    except OSError as exc:
        raise PlanError(f"{path}: cannot read plan: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise PlanError(f"{path}: cannot read plan: not UTF-8 text (byte 0x{exc.object[exc.start]:02x}"
                        f" at offset {exc.start})") from None
    try:
        data = load_yaml(text)  # a key given twice is an error, not a silent override
    except YAMLError as exc:
        raise PlanError(f"{path}: not valid YAML{_yaml_where(exc)}") from None
    return parse_plan(data, source=str(path))


def _yaml_where(exc: Exception) -> str:
    """`` at line 2, column 1: expected ',' or ']'``: where and what, on one line (PyYAML's own is several)."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"{where}: {' '.join(str(what).split())}"
