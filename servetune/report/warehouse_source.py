"""Read a campaign back out of the warehouse, through ``servetune.warehouse.tables`` (never our own SQL schema).

The trials table stores the summary as flattened columns; ``TrialSummary`` is rebuilt from the
same layout the loader used to flatten it (``SUMMARY_SCALARS`` / ``SUMMARY_PERCENTILES``), so a
report from the warehouse shows the same numbers as one from the result directory.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import JSONB

from servetune.report.campaign import STAGE_ORDER, CampaignView, ReportInputError, level_of
from servetune.result import TrialResult, TrialSummary
from servetune.warehouse import db, scheduler_rows
from servetune.warehouse.tables import (
    SUMMARY_PERCENTILES,
    SUMMARY_SCALARS,
    experiments,
    gpu_samples,
    scheduler_batches,
    trials,
    validations,
)


def _iso(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def summary_from_row(row: dict[str, Any]) -> TrialSummary:
    """The inverse of the loader's flattening: summary columns -> TrialSummary."""
    data: dict[str, Any] = {}
    for name, typ in SUMMARY_SCALARS.items():
        value = row.get(f"summary_{name}" if typ is JSONB else name)
        if value is not None:
            data[name] = value
    pcts: dict[str, dict[str, Any]] = defaultdict(dict)
    for column, (field, stat) in SUMMARY_PERCENTILES.items():
        value = row.get(column)
        if value is not None:
            pcts[field][stat] = value
    data.update(pcts)
    return TrialSummary.model_validate(data)


def _server(row: dict[str, Any], batches: list[dict[str, Any]]) -> dict[str, Any]:
    """server_info with the scheduler log's rows put back from scheduler_batches (the loader split them off)."""
    server = dict(row.get("server_info") or {})
    log = server.get("scheduler_log")
    if isinstance(log, dict):
        server["scheduler_log"] = {**{k: v for k, v in log.items() if k != "row_count"}, "rows": batches}
    return server


def _trial_from_row(row: dict[str, Any], samples: list[dict[str, Any]],
                    checks: list[dict[str, Any]], batches: list[dict[str, Any]]) -> TrialResult:
    gpu = dict(row.get("gpu_info") or {})
    gpu["samples"] = samples
    validation = None
    if row.get("validation_success") is not None or checks:
        validation = {"success": bool(row.get("validation_success")), "results": checks}
    return TrialResult(
        trial_id=row["trial_id"], created_at=_iso(row.get("created_at")) or "", status=row["status"],
        failure_reason=row.get("failure_reason"), stage=row.get("stage"), experiment_id=row["experiment_id"],
        target=row.get("target") or {}, server_config=row.get("server_config") or {}, load=row.get("load") or {},
        sla=row.get("sla") or {}, workload=row.get("workload") or {}, t0_unix=row.get("t0_unix") or 0.0,
        gpu=gpu, server=_server(row, batches), environment=row.get("environment") or {},
        summary=summary_from_row(row), validation=validation,
    )


def load_experiment(experiment_id: str, *, database_url: str | None = None) -> CampaignView:
    """One experiment with its trials, GPU samples, scheduler batches and checks; request records are not read."""
    engine = db.engine(database_url)
    try:
        with engine.connect() as conn:
            exp = conn.execute(select(experiments).where(experiments.c.experiment_id == experiment_id)) \
                .mappings().first()
            if exp is None:
                raise ReportInputError(
                    f"{experiment_id}: not a file or directory, and no such experiment in the warehouse "
                    f"({engine.url.render_as_string(hide_password=True)})"
                )
            rows = [dict(r) for r in conn.execute(
                select(trials).where(trials.c.experiment_id == experiment_id).order_by(trials.c.created_at)
            ).mappings()]
            ids = [r["trial_id"] for r in rows]
            samples: dict[str, list[dict[str, Any]]] = defaultdict(list)
            checks: dict[str, list[dict[str, Any]]] = defaultdict(list)
            batches: dict[str, list[dict[str, Any]]] = defaultdict(list)
            if ids:
                for s in conn.execute(
                    select(gpu_samples.c.trial_id, gpu_samples.c.t_s, gpu_samples.c.gpu, gpu_samples.c.mem_used,
                           gpu_samples.c.mem_total, gpu_samples.c.util, gpu_samples.c.power_w)
                    .where(gpu_samples.c.trial_id.in_(ids)).order_by(gpu_samples.c.trial_id, gpu_samples.c.sample_no)
                ).mappings():
                    samples[s["trial_id"]].append({k: s[k] for k in ("t_s", "gpu", "mem_used", "mem_total",
                                                                     "util", "power_w")})
                for v in conn.execute(
                    select(validations).where(validations.c.trial_id.in_(ids))
                    .order_by(validations.c.trial_id, validations.c.seq)
                ).mappings():
                    checks[v["trial_id"]].append({
                        "expectation": v["expectation"], "success": v["success"], "column": v["column_name"],
                        "checklist": v["checklist"], "suite": v["suite"],
                    })
                for b in conn.execute(
                    select(scheduler_batches).where(scheduler_batches.c.trial_id.in_(ids))
                    .order_by(scheduler_batches.c.trial_id, scheduler_batches.c.seq)
                ).mappings():
                    batches[b["trial_id"]].append(scheduler_rows.as_log_row(b))
    finally:
        engine.dispose()
    experiment = {k: _iso(v) for k, v in dict(exp).items()}
    result = [_trial_from_row(r, samples[r["trial_id"]], checks[r["trial_id"]], batches[r["trial_id"]])
              for r in rows]
    result.sort(key=lambda t: (STAGE_ORDER.get(t.stage, 9), level_of(t) or 0, t.created_at))
    return CampaignView(source=f"warehouse:{experiment_id}", experiment=experiment, trials=result,
                    recommendation=experiment.get("recommendation"))
