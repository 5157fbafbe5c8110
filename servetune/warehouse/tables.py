"""The warehouse schema as SQLAlchemy Core tables (the Alembic migrations are generated from it).

experiments (one campaign) -> trials (one measurement, summary as real columns) -> request_records,
gpu_samples, server_samples, scheduler_batches, validations, diagnoses. The summary columns are derived from
``TrialSummary`` so the history queries can filter and sort on them; ``tests/test_warehouse_schema.py`` fails when this
module and the migrations disagree (a new summary field then needs a new migration).
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel
from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    func,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

from servetune.result import Percentiles, TrialSummary

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

TRIGGERS = ("manual", "weekly", "on_change", "bench")
TRIAL_STATUSES = ("ok", "failed", "rejected")

experiments = Table(
    "experiments",
    metadata,
    Column("experiment_id", Text, primary_key=True),
    Column("model", Text, nullable=False),
    Column("engine", Text),
    Column("model_fingerprint", Text),
    Column("prompt_template_fingerprint", Text),
    Column("trigger", Text, nullable=False),
    Column("dag_run_id", Text),
    Column("plan", JSONB),
    Column("status", Text),
    Column("failure_reason", Text),  # why a failed campaign failed: one line, redacted (0014)
    Column("started_at", DateTime(timezone=True)),
    Column("finished_at", DateTime(timezone=True)),
    Column("recommendation", JSONB),
    # what the answer cost (0015): the campaign's GPU seconds, start-ups included (experiment.json), its
    # server starts and the start-ups' seconds kept apart (state.json); NULL where the files do not say
    Column("gpu_seconds", Double),
    Column("server_starts", Integer),
    Column("startup_gpu_seconds", Double),
    Column("loaded_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint(f"trigger IN ({', '.join(repr(t) for t in TRIGGERS)})", name="trigger"),
    Index(None, "model", "started_at"),
)


# which answers are the baseline later runs are compared with (0016): a person's decision, or servetune's when
# the answer is the model's first or changed nothing and fell behind in nothing; reloads never touch it
acceptances = Table(
    "acceptances",
    metadata,
    Column("experiment_id", Text, ForeignKey("experiments.experiment_id", ondelete="CASCADE"), primary_key=True),
    Column("accepted_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("accepted_by", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("automatic", Boolean, nullable=False),
)


# --- the summary, flattened ----------------------------------------------------------------------

_STATS = tuple(Percentiles.model_fields)  # count, mean, p50, p90, p95, p99, max, min
_BIG_INT_FIELDS = {"gpu_mem_total_bytes", "gpu_mem_peak_bytes", "gpu_mem_idle_bytes"}


def _percentile_columns(field: str) -> dict[str, str]:
    """``ttft_ms`` -> ttft_p99_ms ...; ``input_len`` -> input_len_p99 ...; maps column -> stat."""
    if field.endswith("_ms"):
        base = field[: -len("_ms")]
        return {(f"{base}_count" if s == "count" else f"{base}_{s}_ms"): s for s in _STATS}
    return {f"{field}_{s}": s for s in _STATS}


def _scalar_type(name: str, annotation: Any) -> Any:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    base = args[0] if isinstance(annotation, types.UnionType) and len(args) == 1 else annotation
    if base is bool:
        return Boolean
    if base is int:
        return BigInteger if name in _BIG_INT_FIELDS else Integer
    if base is float:
        return Double
    if base is str:
        return Text
    return JSONB  # dicts (errors_by_class, token_count_sources, sla)


def summary_layout() -> tuple[dict[str, Any], dict[str, tuple[str, str]]]:
    """(scalar summary field -> column type, percentile column -> (field, stat)) from TrialSummary."""
    scalars: dict[str, Any] = {}
    percentiles: dict[str, tuple[str, str]] = {}
    for name, info in TrialSummary.model_fields.items():
        if info.annotation is Percentiles:
            for col, stat in _percentile_columns(name).items():
                percentiles[col] = (name, stat)
        else:
            scalars[name] = _scalar_type(name, info.annotation)
    return scalars, percentiles


SUMMARY_SCALARS, SUMMARY_PERCENTILES = summary_layout()


def flatten_summary(summary: TrialSummary) -> dict[str, Any]:
    """The summary as warehouse columns (ttft_p99_ms, input_len_p50, ...; dicts as summary_<name>)."""
    row: dict[str, Any] = {}
    for name, typ in SUMMARY_SCALARS.items():
        value = getattr(summary, name)  # a typed section (multimodal) is stored as its JSON
        row[f"summary_{name}" if typ is JSONB else name] = (value.model_dump(mode="json")
                                                            if isinstance(value, BaseModel) else value)
    for col, (field, stat) in SUMMARY_PERCENTILES.items():
        row[col] = getattr(getattr(summary, field), stat)
    return row


def _summary_columns() -> list[Column]:
    cols: list[Column] = []
    for name, typ in SUMMARY_SCALARS.items():
        cols.append(Column(f"summary_{name}" if typ is JSONB else name, typ))
    for col, (_field, stat) in SUMMARY_PERCENTILES.items():
        cols.append(Column(col, Integer if stat == "count" else Double))
    return cols


trials = Table(
    "trials",
    metadata,
    Column("trial_id", Text, primary_key=True),
    Column("experiment_id", ForeignKey("experiments.experiment_id", ondelete="CASCADE"), nullable=False),
    Column("created_at", DateTime(timezone=True)),
    Column("started_at", DateTime(timezone=True)),  # t0 as wall-clock time
    Column("stage", Text),
    Column("status", Text, nullable=False),
    Column("failure_reason", Text),
    Column("measured_status", Text, nullable=False),  # the status the result file carried
    Column("model", Text),
    Column("engine", Text),
    Column("endpoint", Text),
    Column("target", JSONB),
    Column("server_config", JSONB),
    Column("load", JSONB),
    Column("load_mode", Text),
    Column("concurrency", Integer),
    Column("request_rate", Double),
    Column("sla", JSONB),
    Column("workload", JSONB),
    Column("workload_fingerprint", Text),
    Column("environment", JSONB),
    Column("gpu_info", JSONB),  # state, devices, processes_at_start, interval_ms (samples: gpu_samples)
    Column("server_info", JSONB),  # server_info, metrics_before/after (samples: server_samples)
    Column("t0_unix", Double),
    Column("validation_success", Boolean),
    Column("content_sha256", Text, nullable=False),  # of the loaded result: reloads are no-ops
    Column("loaded_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    *_summary_columns(),
    CheckConstraint(f"status IN ({', '.join(repr(s) for s in TRIAL_STATUSES)})", name="status"),
    Index(None, "experiment_id"),
    Index(None, "model", "started_at"),
    Index(None, "status", "model"),
    Index(None, "workload_fingerprint"),
)

request_records = Table(
    "request_records",
    metadata,
    Column("trial_id", ForeignKey("trials.trial_id", ondelete="CASCADE"), nullable=False),
    Column("request_id", Integer, nullable=False),
    Column("warmup", Boolean, nullable=False),
    Column("t_send_s", Double),
    Column("queue_ms", Double),
    Column("ttft_ms", Double),
    Column("e2e_ms", Double),
    Column("tpot_ms", Double),
    Column("prompt_tokens", Integer),
    Column("completion_tokens", Integer),
    Column("cached_tokens", Integer),
    Column("client_completion_tokens", Integer),
    Column("requested_input_tokens", Integer),
    Column("requested_output_tokens", Integer),
    Column("token_count_source", Text),
    Column("prefix_group", Integer),
    Column("n_images", Integer),
    Column("text_before_images", Integer),  # requested text tokens ahead of the images
    Column("payload_bytes", Integer),  # the request body as sent
    Column("turn", Integer),
    Column("http_status", Integer),
    Column("error_class", Text),
    Column("error_message", Text),
    Column("chunk_offsets_ms", ARRAY(Double)),
    Column("chunk_tokens", ARRAY(Integer)),
    PrimaryKeyConstraint("trial_id", "request_id"),
)

gpu_samples = Table(
    "gpu_samples",
    metadata,
    Column("trial_id", ForeignKey("trials.trial_id", ondelete="CASCADE"), nullable=False),
    Column("sample_no", Integer, nullable=False),
    Column("t_s", Double, nullable=False),
    Column("gpu", Integer, nullable=False),
    Column("mem_used", BigInteger),
    Column("mem_total", BigInteger),
    Column("util", Double),
    Column("power_w", Double),
    Column("energy_mj", BigInteger),  # NVML's total-energy counter (mJ since the driver loaded)
    PrimaryKeyConstraint("trial_id", "sample_no"),
)

server_samples = Table(
    "server_samples",
    metadata,
    Column("trial_id", ForeignKey("trials.trial_id", ondelete="CASCADE"), nullable=False),
    Column("sample_no", Integer, nullable=False),
    Column("t_s", Double, nullable=False),
    Column("name", Text, nullable=False),
    Column("labels", JSONB),
    Column("value", Double),
    PrimaryKeyConstraint("trial_id", "sample_no"),
    Index(None, "name"),
)

scheduler_batches = Table(  # SGLang's "Prefill batch" / "Decode batch" log lines (telemetry.scheduler_log)
    "scheduler_batches",
    metadata,
    Column("trial_id", ForeignKey("trials.trial_id", ondelete="CASCADE"), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("t_s", Double, nullable=False),  # since the trial's t0, 1 s resolution
    Column("kind", Text, nullable=False),  # prefill | decode
    Column("new_seq", Integer),
    Column("new_token", Integer),
    Column("cached_token", Integer),
    Column("pending_token", Integer),
    Column("num_token", Integer),
    Column("running_req", Integer),
    Column("queue_req", Integer),
    Column("token_usage", Double),
    Column("throughput", Double),
    Column("cuda_graph", Boolean),
    PrimaryKeyConstraint("trial_id", "seq"),
    Index(None, "trial_id", "kind"),
)

validations = Table(
    "validations",
    metadata,
    Column("trial_id", ForeignKey("trials.trial_id", ondelete="CASCADE"), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("suite", Text, nullable=False),
    Column("expectation", Text, nullable=False),
    Column("checklist", Text),  # the checklist item (docs/warehouse.md) the expectation implements
    Column("column_name", Text),
    Column("success", Boolean, nullable=False),
    Column("observed_value", JSONB),
    Column("details", JSONB),
    Column("gx_version", Text),
    PrimaryKeyConstraint("trial_id", "seq"),
    Index(None, "expectation", "success"),
)

diagnoses = Table(  # servetune.diagnose findings, written when the trial is loaded (docs/diagnoses.md)
    "diagnoses",
    metadata,
    Column("trial_id", ForeignKey("trials.trial_id", ondelete="CASCADE"), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("kind", Text, nullable=False),  # family.verdict, e.g. memory.sawtooth
    Column("severity", Text, nullable=False),
    Column("summary", Text, nullable=False),
    Column("evidence", JSONB),
    Column("advice", Text),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("trial_id", "seq"),
    CheckConstraint("severity IN ('info', 'warning', 'critical')", name="severity"),
    Index(None, "kind", "severity"),
)

asset_fingerprints = Table(
    "asset_fingerprints",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("asset_uri", Text, nullable=False),  # servetune://model/... or servetune://prompt-template/...
    Column("kind", Text, nullable=False),
    Column("source", Text, nullable=False),
    Column("digest", Text, nullable=False),
    Column("parts", JSONB),
    Column("seen_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index(None, "asset_uri", "seen_at"),
)

#: request_records columns in COPY order (the loader and the benchmark share it).
REQUEST_COLUMNS: tuple[str, ...] = tuple(c.name for c in request_records.columns)
