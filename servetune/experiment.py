"""The campaign folder: the one owner of its layout and of every read and write of its files.

  DIR/experiment.json            the ``ExperimentRecord``: metadata, the (redacted) plan, status, the answer
  DIR/state.json                 the tuner's ``CampaignState`` (``servetune.tuning.state`` parses it)
  DIR/trials/<trial_id>.json     every trial's ``TrialResult``
  DIR/recommendation.json        the recommendation, when there is one
  DIR/report/report.html         the HTML report and its PNGs (``servetune.report.html``)
  DIR/.campaign.lock             held by the one process running the campaign (``servetune.campaign_lock``)

Written by ``servetune.tuning.campaign`` (and the Airflow teardown), read by the report, the warehouse
loader, the checklist, the diagnoses and the CLI. JSON files are written whole or not at all (a temporary
file, then a rename), indented as they always were, so kept campaigns replay byte for byte.

This module sits low: it knows JSON and ``TrialResult`` only, never the tuner's models (the tuner imports
it, so it must not import the tuner back); ``state.json`` travels as raw JSON text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

import orjson

from servetune.result import TrialResult

EXPERIMENT_FILE = "experiment.json"
STATE_FILE = "state.json"
RECOMMENDATION_FILE = "recommendation.json"
TRIALS_DIR = "trials"
REPORT_DIR = "report"
REPORT_FILE = "report.html"
LOCK_FILE = ".campaign.lock"
#: the folder's own JSON files: never trial results (a reader of a folder of loose results skips them)
CAMPAIGN_FILES = (EXPERIMENT_FILE, RECOMMENDATION_FILE, STATE_FILE)


class ExperimentRecord(TypedDict, total=False):
    """``experiment.json`` as the tuner writes it, keys in the order written (the file keeps that order).

    A TypedDict, not a model: the file is the dict itself, so what was read is what is written back.
    ``servetune.warehouse.files.ExperimentInfo`` is the loader's validating view of the same file.
    """

    experiment_id: str
    model: str
    engine: str
    model_fingerprint: str | None
    prompt_template_fingerprint: str | None
    trigger: str  # manual | weekly | on_change | bench
    dag_run_id: str | None
    plan: dict[str, Any]  # redacted
    plan_digest: str
    status: str  # running | done | failed | paused | interrupted
    started_at: str
    finished_at: str | None
    recommendation: dict[str, Any] | None
    ceiling: dict[str, Any] | None
    status_reason: str | None
    gpu_seconds: float


def write_json(path: Path, data: Any) -> None:
    """Indented JSON, atomically: a reader sees the old file or the new one, never a part."""
    tmp = path.with_suffix(".json.tmp")
    tmp.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
    tmp.replace(path)


class ResultFolder:
    """One campaign's result folder: where each file lives, and its load and save."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"ResultFolder({str(self.path)!r})"

    @classmethod
    def under(cls, root: str | Path) -> list[ResultFolder]:
        """The campaign folders directly under ``root`` (those with an experiment.json), by name."""
        return [cls(p.parent) for p in sorted(Path(root).glob(f"*/{EXPERIMENT_FILE}"))]

    # where things are
    @property
    def experiment_file(self) -> Path:
        return self.path / EXPERIMENT_FILE

    @property
    def state_file(self) -> Path:
        return self.path / STATE_FILE

    @property
    def recommendation_file(self) -> Path:
        return self.path / RECOMMENDATION_FILE

    @property
    def trials_dir(self) -> Path:
        return self.path / TRIALS_DIR

    @property
    def lock_file(self) -> Path:
        return self.path / LOCK_FILE

    @property
    def report_dir(self) -> Path:
        return self.path / REPORT_DIR

    @property
    def report_file(self) -> Path:
        return self.report_dir / REPORT_FILE

    def is_campaign(self) -> bool:
        """Looks like a campaign folder: an experiment.json or a trials/ folder."""
        return self.experiment_file.is_file() or self.trials_dir.is_dir()

    def create(self) -> None:
        """The folder and its trials/ (no error when they exist)."""
        self.trials_dir.mkdir(parents=True, exist_ok=True)

    # experiment.json
    def has_experiment(self) -> bool:
        return self.experiment_file.exists()

    def read_experiment(self) -> ExperimentRecord:
        """The stored record; OSError when missing or unreadable, ``orjson.JSONDecodeError`` when not JSON."""
        return orjson.loads(self.experiment_file.read_bytes())

    def write_experiment(self, record: ExperimentRecord | dict[str, Any]) -> None:
        write_json(self.experiment_file, record)

    # state.json
    def read_state_json(self) -> bytes | None:
        """The tuner's state as stored (JSON text), None before the first write; the tuner parses it."""
        return self.state_file.read_bytes() if self.state_file.exists() else None

    def write_state(self, data: dict[str, Any]) -> None:
        """The tuner's state, already dumped to JSON-able data (and redacted by the caller)."""
        write_json(self.state_file, data)

    # trials/
    def trial_file(self, trial_id: str) -> Path:
        return self.trials_dir / f"{trial_id}.json"

    def trial_files(self) -> list[Path]:
        """Every trial file, sorted by name ([] without a trials/ folder)."""
        return sorted(self.trials_dir.glob("*.json"))

    def read_trial(self, trial_id: str) -> TrialResult:
        """One trial by id, through the one strict check (``TrialResult.read``: ``ResultError`` naming the file)."""
        return TrialResult.read(self.trial_file(trial_id))

    def read_trials(self) -> list[TrialResult]:
        return [TrialResult.read(p) for p in self.trial_files()]

    def write_trial(self, result: TrialResult) -> Path:
        """``trials/<trial_id>.json``, atomically and redacted (``TrialResult.save``)."""
        return result.save(self.trial_file(result.trial_id))

    # recommendation.json
    def has_recommendation(self) -> bool:
        return self.recommendation_file.exists()

    def read_recommendation(self) -> dict[str, Any] | None:
        """The stored recommendation, None when the campaign wrote none."""
        if not self.recommendation_file.exists():
            return None
        return orjson.loads(self.recommendation_file.read_bytes())

    def write_recommendation(self, data: dict[str, Any]) -> None:
        write_json(self.recommendation_file, data)
