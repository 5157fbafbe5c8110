"""Load trial results into the warehouse: one transaction per trial, idempotent on the trial id.

A trial already stored with the same content is left alone (its ``content_sha256`` matches); one
stored with different content is a conflict unless ``replace=True``, which swaps it atomically.
Bulk rows (request records, GPU and server samples, scheduler batches) go through psycopg's binary
COPY inside the trial's transaction, so a load that fails half-way leaves nothing behind. Request
records are encoded column-wise by ``request_copy`` in a worker thread while the previous block is sent.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing
from dataclasses import dataclass, field, replace as dc_replace
from pathlib import Path
from typing import Any

import orjson
from psycopg.types.json import Jsonb
from pydantic import ValidationError
from sqlalchemy import Connection, Engine, delete, select, tuple_, update
from sqlalchemy.dialects.postgresql import insert

from servetune.checklist_report import ValidationReport
from servetune.experiment import EXPERIMENT_FILE
from servetune.oserrors import why_not_there
from servetune.redact import redact
from servetune.result import TrialResult
from servetune.warehouse import db, diagnoses, scheduler_rows
from servetune.warehouse.acceptance import auto_accept, awaiting
from servetune.warehouse.files import ExperimentInfo, LoadError, iso, read_campaign, read_trial, ts
from servetune.warehouse.request_copy import WIRE_COLUMNS, EncodeError, copy_stream
from servetune.warehouse.tables import (
    REQUEST_COLUMNS,
    experiments,
    flatten_summary,
    trials,
    validations,
)

Checklist = Callable[[TrialResult], ValidationReport]  # judges a trial before it is stored (servetune.ingest)

log = logging.getLogger(__name__)

assert sorted(WIRE_COLUMNS) == sorted(REQUEST_COLUMNS)  # the COPY names every column, in wire order
_GPU_COLUMNS = ("trial_id", "sample_no", "t_s", "gpu", "mem_used", "mem_total", "util", "power_w", "energy_mj")
_GPU_TYPES = ["text", "int4", "float8", "int4", "int8", "int8", "float8", "float8", "int8"]
_SERVER_COLUMNS = ("trial_id", "sample_no", "t_s", "name", "labels", "value")
_SERVER_TYPES = ["text", "int4", "float8", "text", "jsonb", "float8"]


class TrialConflict(LoadError):
    """The trial id is already stored with different content (load with replace=True to swap it)."""


@dataclass
class TrialLoad:
    trial_id: str
    action: str  # inserted | replaced | unchanged
    status: str  # as stored: ok | failed | rejected
    rows: dict[str, int] = field(default_factory=dict)
    failure_reason: str | None = None


@dataclass
class LoadReport:
    experiment_id: str | None = None
    trials: list[TrialLoad] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # "<file or trial>: <cause>", one per trial not loaded
    accepted: str | None = None  # why servetune took the answer as the baseline; None: a person decides
    awaits: str | None = None  # why the answer waits for a person (servetune.warehouse.acceptance.awaiting)
    plan_name: str | None = None

    @property
    def ok(self) -> bool:
        return not self.errors


def _copy_request_rows(conn: Connection, result: TrialResult, hasher: Any) -> int:
    """COPY the records (binary, encoded column-wise in a worker thread), hashing the bytes sent."""
    cur = conn.connection.driver_connection.cursor()  # the psycopg connection of this transaction
    with cur.copy(f"COPY request_records ({', '.join(WIRE_COLUMNS)}) FROM STDIN (FORMAT BINARY)") as copy:
        with closing(_request_stream(result, hasher, background=True)) as blocks:  # stops the encoder on error
            for block in blocks:
                copy.write(block)
    return len(result.records)


def _request_stream(result: TrialResult, hasher: Any, *, background: bool) -> Iterator[bytes]:
    try:
        yield from copy_stream(result.trial_id, result.records, hasher, background=background)
    except EncodeError as e:
        raise LoadError(f"trial {result.trial_id}: {e}") from None


def _gpu_rows(result: TrialResult) -> list[tuple]:
    out = []
    for i, s in enumerate(result.gpu.get("samples") or []):
        try:
            out.append((result.trial_id, i, float(s["t_s"]), int(s.get("gpu", 0)), s.get("mem_used"),
                        s.get("mem_total"), s.get("util"), s.get("power_w"), s.get("energy_mj")))
        except (KeyError, TypeError, ValueError) as e:
            raise LoadError(f"trial {result.trial_id}: gpu.samples[{i}] is malformed ({e!r})") from None
    return out


def _server_rows(result: TrialResult) -> list[tuple]:
    out = []
    for i, s in enumerate(result.server.get("samples") or []):
        try:
            value = s.get("value")
            out.append((result.trial_id, i, float(s["t_s"]), str(s["name"]), Jsonb(s.get("labels") or {}),
                        None if value is None else float(value)))
        except (KeyError, TypeError, ValueError) as e:
            raise LoadError(f"trial {result.trial_id}: server.samples[{i}] is malformed ({e!r})") from None
    return out


def _header(result: TrialResult) -> dict[str, Any]:
    """``to_dict`` without the (possibly million) records, which are hashed as rows instead."""
    return dc_replace(result, records=[]).to_dict()


def _header_hasher(result: TrialResult) -> Any:
    return hashlib.sha256(orjson.dumps(_header(result), option=orjson.OPT_SORT_KEYS
                                       | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS))


def content_sha256(result: TrialResult) -> str:
    """Hash of everything the trial holds: header (sorted keys), then the request rows' COPY bytes.

    The loader hashes the very bytes it sends, so a first load encodes the rows only once; of the result
    as stored (``TrialResult.redacted``).
    """
    result = result.redacted()
    h = _header_hasher(result)
    for _block in _request_stream(result, h, background=False):
        pass
    return h.hexdigest()


def _copy(conn: Connection, table: str, columns: Iterable[str], types: list[str], rows: Iterable[tuple]) -> int:
    cur = conn.connection.driver_connection.cursor()  # the psycopg connection of this transaction
    n = 0
    with cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(types)
        for row in rows:
            copy.write_row(row)
            n += 1
    return n


def _upsert_experiment(conn: Connection, exp: ExperimentInfo, *, lone: bool) -> None:
    values = redact(exp.model_dump())  # the plan's env values and secret flags stored as *** (servetune.redact)
    stmt = insert(experiments).values(**values)
    if lone:  # a bench result never overwrites an experiment a campaign wrote
        conn.execute(stmt.on_conflict_do_nothing(index_elements=["experiment_id"]))
        return
    mutable = [c for c in values if c != "experiment_id"]
    conn.execute(stmt.on_conflict_do_update(
        index_elements=["experiment_id"],
        set_={c: stmt.excluded[c] for c in mutable},
        # only when something changed, so reloading the same campaign rewrites nothing
        where=tuple_(*[experiments.c[c] for c in mutable]).is_distinct_from(
            tuple_(*[stmt.excluded[c] for c in mutable])),
    ))


def _validation_report(result: TrialResult, checklist: Checklist | None) -> ValidationReport | None:
    """The caller's checklist run on the trial, else the report stored with it (if any)."""
    if checklist is not None:
        return checklist(result)
    if result.validation:
        try:
            return ValidationReport.model_validate(result.validation)
        except ValidationError:
            log.warning("trial %s: stored validation is not a ValidationReport; ignoring it", result.trial_id)
    return None


def _trial_row(result: TrialResult, exp: ExperimentInfo, sha: str, report: ValidationReport | None) -> dict[str, Any]:
    status, reason = result.status, result.failure_reason
    if report is not None and not report.success and status == "ok":
        status, reason = "rejected", report.failure_reason()
    load = result.load or {}
    concurrency = load.get("concurrency")
    rate = load.get("rate")
    gpu_info = {k: v for k, v in (result.gpu or {}).items() if k != "samples"}
    server_info = scheduler_rows.server_info(result.server)  # the batch rows go to scheduler_batches
    return {
        "trial_id": result.trial_id,
        "experiment_id": exp.experiment_id,
        "created_at": iso(result.created_at),
        "started_at": ts(result.t0_unix),
        "stage": result.stage,
        "status": status,
        "failure_reason": reason,
        "measured_status": result.status,
        "model": result.target.get("model") or exp.model,
        "engine": result.target.get("engine") or exp.engine,
        "endpoint": result.target.get("endpoint"),
        "target": result.target,
        "server_config": result.server_config,
        "load": load,
        "load_mode": load.get("mode"),
        "concurrency": int(concurrency) if isinstance(concurrency, (int, float)) else None,
        "request_rate": float(rate) if isinstance(rate, (int, float)) else None,
        "sla": result.sla,
        "workload": result.workload,
        "workload_fingerprint": (result.workload or {}).get("fingerprint"),
        "environment": result.environment,
        "gpu_info": gpu_info,
        "server_info": server_info,
        "t0_unix": result.t0_unix,
        "validation_success": None if report is None else report.success,
        "content_sha256": sha,
        **flatten_summary(result.summary),
    }


def _validation_rows(trial_id: str, report) -> list[dict[str, Any]]:
    if report is None:
        return []
    return [
        {"trial_id": trial_id, "seq": i, "suite": o.suite, "expectation": o.expectation, "checklist": o.checklist,
         "column_name": o.column, "success": o.success, "observed_value": o.observed_value,
         "details": o.details, "gx_version": report.gx_version}
        for i, o in enumerate(report.results)
    ]


def _stored_sha(eng: Engine, trial_id: str) -> str | None:
    with eng.connect() as conn:
        return conn.execute(select(trials.c.content_sha256).where(trials.c.trial_id == trial_id)).scalar()


def load_trial(eng: Engine, result: TrialResult, exp: ExperimentInfo, *, lone: bool = False,
               checklist: Checklist | None = None, replace: bool = False) -> TrialLoad:
    """Load one trial in one transaction (idempotency: the module docstring); stored: ``result.redacted()``."""
    result = result.redacted()
    if result.experiment_id is not None and result.experiment_id != exp.experiment_id:
        raise LoadError(f"trial {result.trial_id} belongs to experiment {result.experiment_id!r}, "
                        f"not {exp.experiment_id!r}")
    stored = _stored_sha(eng, result.trial_id)
    if stored is not None:
        sha = content_sha256(result)
        if stored == sha:
            with eng.begin() as conn:  # the experiment may have moved on (status, recommendation)
                _upsert_experiment(conn, exp, lone=lone)
            return TrialLoad(result.trial_id, "unchanged", _stored_status(eng, result.trial_id))
        if not replace:
            raise TrialConflict(f"trial {result.trial_id} is already stored with different content "
                                "(load with --replace to swap it)")
    report = _validation_report(result, checklist)
    row = _trial_row(result, exp, "pending", report)
    checks = _validation_rows(result.trial_id, report)
    gpu, server = _gpu_rows(result), _server_rows(result)
    sched = scheduler_rows.rows(result.trial_id, result.server, error=LoadError)
    with eng.begin() as conn:
        _upsert_experiment(conn, exp, lone=lone)
        if replace:
            conn.execute(delete(trials).where(trials.c.trial_id == result.trial_id))  # children cascade
        inserted = conn.execute(
            insert(trials).values(**row).on_conflict_do_nothing(index_elements=["trial_id"])
            .returning(trials.c.trial_id)
        ).scalar()
        if inserted is None:  # another loader stored it between our check and now
            conn.rollback()
            if _stored_sha(eng, result.trial_id) == content_sha256(result):
                return TrialLoad(result.trial_id, "unchanged", _stored_status(eng, result.trial_id))
            raise TrialConflict(f"trial {result.trial_id} was stored concurrently with different content")
        hasher = _header_hasher(result)
        counts = {
            "request_records": _copy_request_rows(conn, result, hasher),
            "gpu_samples": _copy(conn, "gpu_samples", _GPU_COLUMNS, _GPU_TYPES, gpu),
            "server_samples": _copy(conn, "server_samples", _SERVER_COLUMNS, _SERVER_TYPES, server),
            "scheduler_batches": _copy(conn, "scheduler_batches", *scheduler_rows.COPY, sched),
        }
        if checks:
            conn.execute(insert(validations), checks)
        counts["validations"] = len(checks)
        counts["diagnoses"] = diagnoses.write(conn, result)  # servetune.diagnose findings, same transaction
        conn.execute(update(trials).where(trials.c.trial_id == result.trial_id)
                     .values(content_sha256=hasher.hexdigest()))
    action = "replaced" if stored is not None else "inserted"
    log.info("trial %s: %s as %s (%d request rows)", result.trial_id, action, row["status"],
             counts["request_records"])
    return TrialLoad(result.trial_id, action, row["status"], counts, row["failure_reason"])


def _stored_status(eng: Engine, trial_id: str) -> str:
    with eng.connect() as conn:
        return conn.execute(select(trials.c.status).where(trials.c.trial_id == trial_id)).scalar_one()


def load_result(engine_or_url: Engine | str | None, source: str | Path | TrialResult, *,
                checklist: Checklist | None = None, replace: bool = False) -> LoadReport:
    """Load a campaign directory, a trial JSON file or an in-memory ``TrialResult``.

    Each trial is its own transaction: a bad trial is reported in ``LoadReport.errors`` and the
    others still load. ``checklist`` (servetune.ingest passes the report checklist) judges each trial
    before it is stored; without one, a trial keeps the verdict stored with it, if any.
    """
    from servetune.warehouse.migrate import check_schema

    eng = engine_or_url if isinstance(engine_or_url, Engine) else db.engine(engine_or_url)
    try:
        with eng.connect() as conn:
            check_schema(conn)  # behind, ahead or foreign: refused before anything is written
        return _load(eng, source, checklist=checklist, replace=replace)
    finally:
        if eng is not engine_or_url:
            eng.dispose()


def _load(eng: Engine, source: str | Path | TrialResult, **kw: Any) -> LoadReport:
    report = LoadReport()
    if isinstance(source, TrialResult):
        exp = ExperimentInfo.for_lone_trial(source)
        report.experiment_id = exp.experiment_id
        report.trials.append(load_trial(eng, source, exp, lone=True, **kw))
        return report
    path = Path(source)
    if path.is_file() and path.name == EXPERIMENT_FILE:
        path = path.parent
    if path.is_dir():
        exp, files = read_campaign(path)  # the result folder's layout: servetune.experiment
        report.experiment_id = exp.experiment_id
        if not files:
            with eng.begin() as conn:
                _upsert_experiment(conn, exp, lone=False)
        for f in files:
            try:
                report.trials.append(load_trial(eng, read_trial(f), exp, **kw))
            except LoadError as e:
                report.errors.append(str(e) if str(f) in str(e) else f"{f}: {e}")
            except db.WarehouseUnavailable:  # the server went away: the rest would each wait and fail alike
                raise
            except Exception as e:  # a database error: this trial rolled back, the rest still load
                report.errors.append(f"{f}: {type(e).__name__}: {str(e).splitlines()[0]}")
        if not report.errors:  # the baseline for later runs, when no person needs to decide (acceptance.py)
            with eng.begin() as conn:
                report.accepted = auto_accept(conn, exp.experiment_id, exp.model, exp.status, exp.recommendation)
            report.awaits = None if report.accepted else awaiting(exp.status, exp.recommendation)
        report.plan_name = (exp.plan or {}).get("name")
        return report
    if not path.exists():
        raise LoadError(f"{path}: {why_not_there(path)}")
    result = read_trial(path)
    exp = ExperimentInfo.for_lone_trial(result)
    report.experiment_id = exp.experiment_id
    report.trials.append(load_trial(eng, result, exp, lone=True, **kw))
    return report
