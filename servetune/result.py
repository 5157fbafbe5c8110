"""The trial result: what one measurement produced, as saved to JSON and loaded to the warehouse.

A trial is the unit of servetune (docs/metrics.md): one server configuration, one workload,
one load level, one measurement window. ``TrialResult`` is the in-memory and on-disk
form; ``TrialSummary`` holds every figure the report checklist needs.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, get_args

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from servetune.multimodal import MultimodalSummary
from servetune.records import RequestRecord
from servetune.redact import redact, redact_text
from servetune.result_check import RecordIn, ResultError, check_samples, first_error, read_json

#: the one list of stage names: a trial's ``stage`` (TrialSpec, TrialOutcome, TrialResult, the warehouse)
#: ``protocol``: a plan's other ways of measuring (servetune.plan.protocols), run first, never decided on
Stage = Literal["protocol", "correctness", "baseline", "ramp", "bisect", "refine", "robustness"]
#: every stage, in the order a campaign walks them
ALL_STAGES: tuple[Stage, ...] = get_args(Stage)

SCHEMA = "servetune.trial/1"


class Percentiles(BaseModel):
    """p50/p90/p95/p99/max/mean of one distribution; ``count`` says how many values."""

    model_config = ConfigDict(extra="forbid")

    count: int = 0
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None
    min: float | None = None


class TrialSummary(BaseModel):
    """Every number the report checklist needs, computed by ``servetune.metrics.summarize``."""

    model_config = ConfigDict(extra="forbid")

    # counts
    requests_total: int = 0
    requests_measured: int = 0  # in the window, warm-up excluded
    requests_warmup: int = 0
    requests_ok: int = 0
    requests_failed: int = 0
    error_rate: float = 0.0
    errors_by_class: dict[str, int] = {}
    # the window (seconds relative to t0)
    window_start_s: float | None = None
    window_end_s: float | None = None
    window_s: float | None = None
    # steady (servetune.validity) | waves (static batches) | stated (by the caller) | no_steady_window
    window_source: str | None = None
    # validity (servetune.validity): is this a measurement of the load it states?
    valid: bool | None = None  # None: computed before validity existed
    invalid_reasons: list[str] = []
    validity_rules: dict[str, float] = {}  # the ValidityRules applied
    scenario: str | None = None  # closed_loop (concurrency) | open_loop (rate) | waves (static batches)
    offered_concurrency: int | None = None
    offered_rate: float | None = None  # req/s asked for (open loop)
    completions_in_window: int = 0  # measured requests that completed inside the window: the summary's set
    completions_needed: int = 0
    in_flight_target: float | None = None  # closed loop: the streams
    in_flight_mean: float | None = None  # time-weighted over the window
    in_flight_min: float | None = None  # lowest of up to 20 bins of the window
    in_flight_min_fraction: float | None = None  # in_flight_min / in_flight_target
    dispatch_fraction: float | None = None  # open loop: achieved / scheduled dispatch rate
    scheduled_rate: float | None = None  # open loop: the arrival schedule's own rate over the trial
    completion_fraction: float | None = None  # open loop: completions / arrivals in the window
    latency_growth: float | None = None  # open loop: E2E per token, last quarter of arrivals / the second
    latency_growth_interval: list[float] | None = None  # its 95% interval [lo, hi] (each median's order statistics)
    sustained: bool | None = None  # open loop: the server kept up (completions and latency growth within the rules)
    tokens_per_request: float | None = None  # output_tokens_per_s / request_throughput: the set's mean output
    throughput_mismatch: float | None = None  # output_tokens_per_s_arrived / output_tokens_per_s - 1
    # latency distributions (ms): prefill (TTFT) and decode (ITL, TPOT) kept apart
    ttft_ms: Percentiles = Percentiles()
    itl_ms: Percentiles = Percentiles()
    tpot_ms: Percentiles = Percentiles()
    e2e_ms: Percentiles = Percentiles()
    queue_ms: Percentiles = Percentiles()
    # lengths (tokens, server usage)
    input_len: Percentiles = Percentiles()
    output_len: Percentiles = Percentiles()
    cached_len: Percentiles = Percentiles()
    # each p99's 95% interval (order statistics, servetune.stats.quantile_interval): ttft/tpot/e2e -> [lo, hi]
    p99_interval_ms: dict[str, list[float]] = {}
    lengths_exact: bool = False  # prompts built with the model's tokenizer
    token_count_sources: dict[str, int] = {}
    # throughput over the window
    request_throughput: float | None = None  # req/s
    input_tokens_per_s: float | None = None
    output_tokens_per_s: float | None = None
    decode_tokens_per_s: float | None = None  # the window's requests' output tokens minus their first / window
    output_tokens_per_s_arrived: float | None = None  # tokens that arrived in the window (edges included)
    total_tokens_per_s: float | None = None
    # goodput under the SLA
    goodput_rps: float | None = None
    goodput_fraction: float | None = None  # good / measured
    sla: dict[str, float] = {}
    # prefix cache
    prefix_hit_rate: float | None = None  # sum(cached)/sum(prompt) from usage
    prefix_hit_rate_server: float | None = None  # counter deltas from /metrics
    cache_hit_rate_gauge: float | None = None  # the (misleading) gauge, kept for contrast
    client_lag_p99_ms: float | None = None  # the client's event loop, late to wake over the window (loadgen.lag)
    by_turn: list[dict[str, Any]] | None = None  # multi-turn: a row per turn index (servetune.per_turn)
    multimodal: MultimodalSummary | None = None  # trials with images (servetune.multimodal)
    # GPU memory curve
    gpu_state: str = "unknown"  # ok | no_gpu | error
    gpu_samples: int = 0
    gpu_sample_interval_ms: float | None = None
    gpu_mem_total_bytes: int | None = None
    gpu_mem_peak_bytes: int | None = None
    gpu_mem_mean_bytes: float | None = None
    gpu_mem_idle_bytes: int | None = None  # at trial start
    gpu_mem_peak_fraction: float | None = None
    gpu_util_mean: float | None = None
    gpu_power_mean_w: float | None = None  # every sample of the trial, all GPUs summed
    # energy and cost over the window (servetune.energy)
    energy_method: str | None = None  # counter (NVML total energy) | power_curve (integrated) | modelled (sim)
    energy_j: float | None = None  # all GPUs
    energy_per_request_j: float | None = None
    energy_per_output_token_j: float | None = None
    energy_curve_over_counter: float | None = None  # the integrated curve / the counter, where both exist
    gpu_power_window_mean_w: float | None = None
    gpu_power_peak_w: float | None = None
    energy: dict[str, Any] | None = None  # per GPU: joules (counter, curve), mean, peak, the board's limit
    cost_gpu_hour_usd: float | None = None  # the plan's price
    cost_gpus: int | None = None
    cost_per_mtok_usd: float | None = None  # per million output tokens at the window's throughput
    cost_per_1k_good_usd: float | None = None  # per 1,000 requests inside the SLA, at the goodput
    gpu_clean_at_start: bool | None = None  # no foreign process held the GPU
    # server-side signals (SGLang tuning guide)
    server_token_usage_max: float | None = None
    server_queue_reqs_max: float | None = None
    server_queue_reqs_mean: float | None = None
    server_running_reqs_mean: float | None = None
    server_retractions: float | None = None
    server_samples: int = 0
    server_samples_in_window: int = 0  # scrapes inside the window (the gauges above use those when any)
    # the scheduler's own log lines (servetune.telemetry.scheduler_log), when the server's log was read
    sched_prefill_batches: int | None = None
    sched_decode_lines: int | None = None  # one per --decode-log-interval decode steps
    sched_decode_running_mean: float | None = None  # requests per decode batch
    sched_gen_throughput_mean: float | None = None  # tokens/s as the scheduler reports it
    sched_queue_max: int | None = None
    sched_token_usage_max: float | None = None
    sched_cache_hit_rate: float | None = None  # cached / (new + cached) tokens over prefill batches
    sched_cuda_graph_fraction: float | None = None  # decode lines with cuda graph: True


@dataclass
class TrialResult:
    """One trial: inputs (target, load, workload), raw data (records, samples) and the summary."""

    trial_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    status: str = "ok"  # ok | failed | rejected (after validation)
    failure_reason: str | None = None
    stage: str | None = None  # tuning stage, None for a lone `servetune bench`
    experiment_id: str | None = None
    target: dict[str, Any] = field(default_factory=dict)  # url, endpoint, model, engine
    server_config: dict[str, Any] = field(default_factory=dict)  # flags the server was started with
    load: dict[str, Any] = field(default_factory=dict)  # mode, concurrency, rate, requests, warmup
    sla: dict[str, Any] = field(default_factory=dict)
    workload: dict[str, Any] = field(default_factory=dict)  # spec, fingerprint, lengths_exact
    t0_unix: float = 0.0  # wall-clock time of t0, to line samples up with other data
    records: list[RequestRecord] = field(default_factory=list)
    gpu: dict[str, Any] = field(default_factory=dict)  # state, devices, processes_at_start, samples
    server: dict[str, Any] = field(default_factory=dict)  # server_info, metrics_before/after, samples
    environment: dict[str, Any] = field(default_factory=dict)
    summary: TrialSummary = field(default_factory=TrialSummary)
    validation: dict[str, Any] | None = None  # filled by servetune.validation

    def redacted(self) -> TrialResult:
        """A copy safe to store or show (``servetune.redact``): secret flags in ``server_config``, URL
        passwords in ``target``, secrets in any text masked ``***``; records only where an error names one."""
        records = [replace(r, error_message=redact_text(r.error_message)) if isinstance(r.error_message, str) else r
                   for r in self.records]
        return replace(
            self, failure_reason=redact(self.failure_reason),
            target=redact(self.target), server_config=redact(self.server_config), load=redact(self.load),
            sla=redact(self.sla), workload=redact(self.workload), records=records, gpu=redact(self.gpu),
            server=redact(self.server), environment=redact(self.environment),
            summary=TrialSummary.model_validate(redact(self.summary.model_dump(mode="json"))),
            validation=redact(self.validation),
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, always redacted: whatever is saved or loaded from it holds no secret."""
        return self.redacted()._plain_dict()

    def _plain_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "trial_id": self.trial_id,
            "created_at": self.created_at,
            "status": self.status,
            "failure_reason": self.failure_reason,
            "stage": self.stage,
            "experiment_id": self.experiment_id,
            "target": self.target,
            "server_config": self.server_config,
            "load": self.load,
            "sla": self.sla,
            "workload": self.workload,
            "t0_unix": self.t0_unix,
            "summary": self.summary.model_dump(mode="json"),
            "validation": self.validation,
            "environment": self.environment,
            "gpu": self.gpu,
            "server": self.server,
            "records": [r.to_dict() for r in self.records],
        }

    @classmethod
    def from_dict(cls, d: Any) -> TrialResult:
        """The typed result, or ``ResultError`` naming the first bad field (``servetune.result_check``)."""
        if not isinstance(d, dict):
            raise ResultError(f"a trial result must be a JSON object, got {type(d).__name__}")
        if d.get("schema") != SCHEMA:
            raise ResultError(f"not a servetune trial result (schema={d.get('schema')!r}, want {SCHEMA!r})")
        try:
            f = _TrialFile.model_validate(d, strict=True)
        except ValidationError as exc:
            raise ResultError(first_error(exc)) from None
        check_samples(f.gpu or {}, f.server or {})
        return cls(
            trial_id=f.trial_id, created_at=f.created_at, status=f.status, failure_reason=f.failure_reason,
            stage=f.stage, experiment_id=f.experiment_id, target=f.target or {}, server_config=f.server_config or {},
            load=f.load or {}, sla=f.sla or {}, workload=f.workload or {}, t0_unix=f.t0_unix,
            records=[RequestRecord(**r) for r in f.records], gpu=f.gpu or {}, server=f.server or {},
            environment=f.environment or {}, summary=f.summary, validation=f.validation,
        )

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        try:
            tmp.write_bytes(orjson.dumps(self.to_dict(), option=orjson.OPT_SERIALIZE_NUMPY))
            tmp.replace(path)  # never leave a half-written result behind
        except OSError:
            tmp.unlink(missing_ok=True)  # a full disk: no truncated .tmp left either
            raise
        return path

    @classmethod
    def read(cls, path: str | Path) -> TrialResult:
        """Read a saved result (named ``read``: ``load`` is the load-level field); every reader of a result
        file comes here, so a bad one fails alike everywhere: ``ResultError("PATH: FIELD: what is wrong")``."""
        data = read_json(path)
        try:
            return cls.from_dict(data)
        except ResultError as exc:
            raise ResultError(f"{path}: {exc}") from None


class _TrialFile(BaseModel):
    """The JSON form as read back, checked strictly (``TrialResult.from_dict``); unknown top-level keys dropped."""

    model_config = ConfigDict(extra="ignore")

    trial_id: str = Field(min_length=1)
    created_at: str
    status: Literal["ok", "failed", "rejected"] = "ok"
    failure_reason: str | None = None
    stage: str | None = None
    experiment_id: str | None = None
    target: dict[str, Any] | None = None
    server_config: dict[str, Any] | None = None
    load: dict[str, Any] | None = None
    sla: dict[str, Any] | None = None
    workload: dict[str, Any] | None = None
    t0_unix: float = 0.0
    gpu: dict[str, Any] | None = None
    server: dict[str, Any] | None = None
    environment: dict[str, Any] | None = None
    summary: TrialSummary
    records: list[RecordIn]  # type: ignore[valid-type]
    validation: dict[str, Any] | None = None
