"""What the loader reads from disk: ``experiment.json`` and trial JSON, each failure one line naming the file.

Where the files are is ``servetune.experiment.ResultFolder``'s to say (``read_campaign``).
Trial files go through ``TrialResult.read`` (``servetune.result_check``), the same check ``servetune validate``
runs, so a result is refused alike by both commands, before any row is written.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from servetune.experiment import ResultFolder
from servetune.result import TrialResult
from servetune.result_check import ResultError, read_json
from servetune.warehouse.tables import TRIGGERS

#: an experiment in one of these ended without its answer: experiment.json's ``status_reason`` says why
FAILED_STATUSES = ("failed", "interrupted")
REASON_MAX = 500  # characters of a stored failure reason


def one_line(text: str | None) -> str | None:
    """The first non-blank line of ``text``, stripped and at most ``REASON_MAX`` characters; None when empty."""
    line = next((ln.strip() for ln in (text or "").splitlines() if ln.strip()), "")
    if not line:
        return None
    return line if len(line) <= REASON_MAX else line[:REASON_MAX - 1] + "…"


class LoadError(ValueError):
    """A result that cannot be loaded; the message names the file or trial and the cause."""


def ts(unix: float | None) -> datetime | None:
    return datetime.fromtimestamp(unix, UTC) if unix else None


def iso(value: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(value) if value else None
    except ValueError:
        return None


class ExperimentInfo(BaseModel):
    """``DIR/experiment.json`` as written by the tuning CLI (``servetune.experiment.ExperimentRecord``), checked
    for the warehouse: the fields its rows need, a known trigger."""

    model_config = ConfigDict(extra="ignore")

    experiment_id: str
    model: str
    engine: str | None = None
    model_fingerprint: str | None = None
    prompt_template_fingerprint: str | None = None
    trigger: str = "manual"
    dag_run_id: str | None = None
    plan: dict[str, Any] | None = None
    status: str | None = None
    failure_reason: str | None = None  # from status_reason when the status is failed (redacted when stored)
    started_at: datetime | None = None
    finished_at: datetime | None = None
    recommendation: dict[str, Any] | None = None
    gpu_seconds: float | None = None  # the campaign's GPU time, start-ups included (protocols apart)
    server_starts: int | None = None  # from state.json (``spending``)
    startup_gpu_seconds: float | None = None

    @field_validator("gpu_seconds", "startup_gpu_seconds", mode="before")
    @classmethod
    def _seconds(cls, v: Any) -> float | None:  # a figure the file lacks or garbles is unknown, never a failed load
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 else None

    @model_validator(mode="before")
    @classmethod
    def _failure_from_status_reason(cls, data: Any) -> Any:
        """experiment.json says why in ``status_reason`` (also for a paused or done campaign): kept only
        when the campaign failed, so a resumed campaign that then concluded clears it on reload."""
        if isinstance(data, dict) and "failure_reason" not in data:
            failed = data.get("status") in FAILED_STATUSES
            data = {**data, "failure_reason": data.get("status_reason") if failed else None}
        return data

    @field_validator("failure_reason", mode="before")
    @classmethod
    def _one_line(cls, v: Any) -> str | None:  # a malformed reason never blocks the load
        return one_line(v) if isinstance(v, str) else None

    @field_validator("trigger")
    @classmethod
    def _known_trigger(cls, v: str) -> str:
        if v not in TRIGGERS:
            raise ValueError(f"trigger must be one of {', '.join(TRIGGERS)}, got {v!r}")
        return v

    @classmethod
    def for_lone_trial(cls, result: TrialResult) -> ExperimentInfo:
        """A ``servetune bench`` result becomes a one-trial experiment whose id derives from the trial."""
        return cls(
            experiment_id=result.experiment_id or f"bench-{result.trial_id}",
            model=str(result.target.get("model") or "unknown"),
            engine=result.target.get("engine"),
            trigger="bench" if result.experiment_id is None else "manual",
            status=result.status,
            failure_reason=result.failure_reason if result.status == "failed" else None,
            started_at=ts(result.t0_unix) or iso(result.created_at),
        )


def read_trial(path: Path) -> TrialResult:
    try:
        return TrialResult.read(path)
    except ResultError as e:
        raise LoadError(str(e)) from None


def read_experiment(path: Path) -> ExperimentInfo:
    try:
        return ExperimentInfo.model_validate(read_json(path))
    except ResultError as e:
        raise LoadError(str(e)) from None
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise LoadError(f"{path}: field {where!r}: {first['msg']}") from None


def spending(state: Any) -> dict[str, Any]:
    """What state.json says the campaign's GPU time went on: its server starts (trials that started the
    server) and, where the tuner kept them apart, the start-ups' seconds. Unknown (None) when there is no
    state, or for start-ups when a start kept none (a state written before the tuner kept them)."""
    outcomes = state.get("outcomes") if isinstance(state, dict) else None
    if not isinstance(outcomes, list):
        return {"server_starts": None, "startup_gpu_seconds": None}
    outcomes = [o for o in outcomes if isinstance(o, dict)]
    starts = [o for o in outcomes if o.get("restarted") is True]
    known = all(isinstance(o.get("startup_seconds"), int | float) and not isinstance(o.get("startup_seconds"), bool)
                for o in starts)
    # the warm-up after a start comes with the server's first measured trial: every outcome's part counts
    spent = sum(o.get("startup_seconds") or 0.0 for o in outcomes)
    return {"server_starts": len(starts), "startup_gpu_seconds": round(float(spent), 3) if known else None}


def read_spending(folder: ResultFolder) -> dict[str, Any]:
    """``spending`` of a folder's state.json; a missing or unreadable one says nothing (never a failed load)."""
    try:
        raw = folder.read_state_json()
        return spending(orjson.loads(raw) if raw is not None else None)
    except (OSError, orjson.JSONDecodeError):
        return spending(None)


def read_campaign(path: Path) -> tuple[ExperimentInfo, list[Path]]:
    """A campaign folder: its checked experiment (with state.json's ``spending``) and its trial files (sorted);
    ``LoadError`` without experiment.json."""
    folder = ResultFolder(path)
    if not folder.experiment_file.is_file():
        raise LoadError(f"{path}: a campaign directory needs experiment.json")
    exp = read_experiment(folder.experiment_file)
    return exp.model_copy(update=read_spending(folder)), folder.trial_files()
