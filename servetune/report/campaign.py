"""What a report is drawn from: one campaign (or one lone bench trial), whatever it was stored in.

The figures and the HTML only ever see a ``CampaignView``; the loaders here turn a campaign result
directory, a single JSON file, or an experiment id in the warehouse into one, so a report looks the
same wherever its data came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from servetune.experiment import EXPERIMENT_FILE, ResultFolder
from servetune.redact import redact, redact_text
from servetune.result import SCHEMA as TRIAL_SCHEMA, TrialResult
from servetune.result_check import ResultError, read_json
from servetune.sla import SLA
from servetune.tuning.state import ALL_STAGES, Stage
from servetune.tuning.verdict import judge_result

# Stages that measure the load curve (throughput/latency vs concurrency); `refine` trials vary
# the server config near the ceiling and get their own heatmap, `correctness` is a single request.
# None: a lone bench trial, on the curve and after every stage.
CURVE_STAGES: tuple[Stage | None, ...] = (None, "baseline", "ramp", "bisect")
STAGE_ORDER: dict[Stage | None, int] = {**{s: i for i, s in enumerate(ALL_STAGES)}, None: len(ALL_STAGES)}


class ReportInputError(ValueError):
    """The thing asked for cannot be read as a campaign; the message names the file and the cause."""


@dataclass
class CampaignView:
    """One experiment's metadata, its trials and its recommendation, plus where they came from."""

    source: str
    experiment: dict[str, Any] = field(default_factory=dict)
    trials: list[TrialResult] = field(default_factory=list)
    recommendation: dict[str, Any] | None = None

    def redacted(self) -> CampaignView:
        """A copy safe to show (``servetune.redact``): the plan's env values, secret flags, URL passwords ``***``."""
        return CampaignView(source=redact_text(self.source), experiment=redact(self.experiment),
                        trials=[t.redacted() for t in self.trials], recommendation=redact(self.recommendation))

    @property
    def experiment_id(self) -> str | None:
        return self.experiment.get("experiment_id") or next(
            (t.experiment_id for t in self.trials if t.experiment_id), None
        )

    @property
    def model(self) -> str | None:
        return self.experiment.get("model") or next(
            (t.target.get("model") for t in self.trials if t.target.get("model")), None
        )

    @property
    def sla(self) -> dict[str, float]:
        """The plan's SLA section, else the SLA the trials were judged with (lone bench results)."""
        plan_sla = (self.experiment.get("plan") or {}).get("sla") or {}
        if plan_sla:
            return {k: float(v) for k, v in plan_sla.items() if isinstance(v, int | float)}
        for t in self.trials:
            if t.sla:
                return {k: float(v) for k, v in t.sla.items() if isinstance(v, int | float)}
        return {}

    def curve_trials(self) -> list[TrialResult]:
        """Trials on the load curve that have a concurrency, sorted by it."""
        out = [t for t in self.trials if t.stage in CURVE_STAGES and level_of(t) is not None]
        return sorted(out, key=lambda t: (level_of(t), t.created_at))

    def main_curve(self) -> list[TrialResult]:
        """The curve trials of the config most of them ran (the start config the ramp walked)."""
        curve = self.curve_trials()
        keys = [config_key(t.server_config) for t in curve]
        if not keys:
            return []
        main = max(dict.fromkeys(keys), key=keys.count)  # ties: the config seen first
        return [t for t, k in zip(curve, keys, strict=True) if k == main]

    def ceiling_info(self) -> dict[str, Any]:
        """The stated ceiling section (kind, reasons, marginal levels, pass/fail trial ids), {} when none."""
        value = self.experiment.get("ceiling")
        return value if isinstance(value, dict) else {}

    def refine_trials(self) -> list[TrialResult]:
        return [t for t in self.trials if t.stage == "refine"]

    def capacity(self) -> float | None:
        """Rate mode: the stated capacity, requests/s at the SLA (None for a closed-loop campaign)."""
        value = self.experiment.get("ceiling")
        rate = value.get("rate") if isinstance(value, dict) else None
        return float(rate) if isinstance(rate, int | float) else None

    def ceiling(self) -> tuple[int | None, str]:
        """The concurrency ceiling and where the number came from (stated, never silently guessed)."""
        for holder, name in ((self.recommendation or {}, "recommendation"), (self.experiment, "experiment")):
            value = holder.get("ceiling") if isinstance(holder, dict) else None
            if isinstance(value, dict):
                value = value.get("concurrency") if value.get("concurrency") is not None else value.get("rate")
            if isinstance(value, int | float):
                return (int(value) if float(value).is_integer() else value), f"{name}.ceiling"  # type: ignore[return-value]
        if self.recommendation and isinstance(self.recommendation.get("concurrency"), int | float):
            return int(self.recommendation["concurrency"]), "recommendation.concurrency"
        derived = derive_ceiling(self.main_curve(), self.sla)
        return derived, "derived from the ramp (highest level meeting the p99 SLA)" if derived else "none"


def flag_value(config: dict[str, Any], name: str) -> Any:
    """A server flag whatever its spelling: ``chunked_prefill_size``, ``chunked-prefill-size`` or
    ``--chunked-prefill-size``."""
    want = name.lstrip("-").replace("-", "_")
    for key, value in config.items():
        if key.lstrip("-").replace("-", "_") == want:
            return value
    return None


def level_of(trial: TrialResult) -> int | float | None:
    """The level the trial ran at: its streams, or the offered requests/s of an open loop."""
    if trial.load.get("mode") == "rate" and isinstance(trial.load.get("rate"), int | float):
        return float(trial.load["rate"])
    value = trial.load.get("concurrency")
    return int(value) if isinstance(value, int | float) else None


def level_label(trials: list[TrialResult]) -> str:
    """What the levels of these trials are: an axis and column label."""
    return "offered req/s" if any(t.load.get("mode") == "rate" for t in trials) else "concurrency"


def level_axis(trials: list[TrialResult]) -> str:
    """The level axis with its unit: in-flight streams of a closed loop, offered requests/s of an open one."""
    return "offered load (req/s)" if level_label(trials) == "offered req/s" else "concurrency (streams in flight)"


def is_simulated(trial: TrialResult) -> bool:
    """Modelled by servetune.sim, not measured: a report must say so wherever its figures appear."""
    return (trial.target.get("engine") == "sim" or trial.environment.get("simulated") is True
            or trial.gpu.get("state") == "simulated" or trial.summary.gpu_state == "simulated")


def simulated_mark(trials: list[TrialResult]) -> str:
    """'' (all measured), ' (simulated)', or ' (k of n trials simulated)' for a title."""
    n = sum(map(is_simulated, trials))
    if not n:
        return ""
    return " (simulated)" if n == len(trials) else f" ({n} of {len(trials)} trials simulated)"


def config_key(config: dict[str, Any]) -> str:
    """Two trials with the same key ran the same server (flag spelling normalised)."""
    norm = {k.lstrip("-").replace("-", "_"): v for k, v in config.items()}
    return orjson.dumps(norm, option=orjson.OPT_SORT_KEYS).decode()


def is_invalid(trial: TrialResult) -> bool:
    """Marked INVALID by servetune.validity (legacy results, valid=None, are not)."""
    return trial.summary.valid is False


def counts(trial: TrialResult) -> bool:
    """Whether a trial may decide anything: as the tuner's ``TrialOutcome.valid`` (not failed, not INVALID)."""
    return trial.status != "failed" and not is_invalid(trial)


def sla_limits(sla: dict[str, float]) -> SLA:
    """The report's SLA section as the tuner's SLA; a limit the section leaves out is not checked."""
    known = {k: float(v) for k, v in sla.items() if k in SLA.model_fields}
    known.setdefault("max_error_rate", 1.0)  # no error limit stated: none applied
    return SLA.model_construct(**known)


def meets_sla(trial: TrialResult, sla: dict[str, float]) -> bool:
    """The tuner's trial verdict (``servetune.tuning.verdict``), and not rejected by the checklist.

    An INVALID trial did not measure the load it states, so whatever its numbers it never passes; an open
    loop the server fell behind fails as ``overload``, as it did in the tuner."""
    return trial.status != "rejected" and judge_result(trial, sla_limits(sla)).passed


def level_verdicts(curve: list[TrialResult], sla: dict[str, float]) -> dict[int, list[bool]]:
    """Per concurrency, the SLA verdict of each trial that counts (INVALID and failed ones left out)."""
    out: dict[int, list[bool]] = {}
    for t in curve:
        c = level_of(t)
        if c is not None:
            out.setdefault(c, [])
            if counts(t):
                out[c].append(meets_sla(t, sla))
    return out


def derive_ceiling(curve: list[TrialResult], sla: dict[str, float]) -> int | None:
    """Highest concurrency that met the SLA, for results that do not state their ceiling.

    As the tuner pools repeats: a level passes when most of its counted trials pass (a tie fails);
    a level with only INVALID trials has no verdict and does not pass."""
    passing = [c for c, votes in level_verdicts(curve, sla).items() if sum(votes) * 2 > len(votes)]
    return max(passing, default=None)


def marginal_levels(curve: list[TrialResult], sla: dict[str, float]) -> list[int]:
    """Levels whose counted repeats disagree on the SLA verdict."""
    return sorted(c for c, votes in level_verdicts(curve, sla).items() if 0 < sum(votes) < len(votes))


def _read_json(path: Path) -> Any:
    if not path.exists():
        raise ReportInputError(f"{path}: no such file")
    try:
        return read_json(path)  # the one reader of result files: a key given twice is refused here too
    except ResultError as exc:
        raise ReportInputError(str(exc)) from None


def _load_trial(path: Path) -> TrialResult:
    try:
        return TrialResult.from_dict(_read_json(path))
    except ReportInputError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise ReportInputError(f"{path}: not a readable trial result: {exc}") from None


def load_result_dir(directory: Path) -> CampaignView:
    """A campaign directory as the tuning CLI writes it: experiment.json, trials/*.json, recommendation.json;
    state.json's server starts join the experiment under the warehouse's column names (``server_starts``,
    ``startup_gpu_seconds``), so the report reads the answer's cost alike from either."""
    folder = ResultFolder(directory)
    exp_path = folder.experiment_file
    if not folder.is_campaign():
        raise ReportInputError(f"{directory}: neither experiment.json nor trials/ found: not a campaign directory")
    experiment = _read_json(exp_path) if exp_path.is_file() else {}
    if not isinstance(experiment, dict):
        raise ReportInputError(f"{exp_path}: expected a JSON object, got {type(experiment).__name__}")
    trials = [_load_trial(p) for p in folder.trial_files()]
    rec_path = folder.recommendation_file
    recommendation = _read_json(rec_path) if rec_path.is_file() else experiment.get("recommendation")
    if recommendation is not None and not isinstance(recommendation, dict):
        raise ReportInputError(f"{rec_path}: expected a JSON object, got {type(recommendation).__name__}")
    trials.sort(key=lambda t: (STAGE_ORDER.get(t.stage, 9), level_of(t) or 0, t.created_at))
    from servetune.warehouse.files import read_spending

    experiment = {**read_spending(folder), **experiment}  # state.json's server starts, as the warehouse keeps them
    return CampaignView(source=str(directory), experiment=experiment, trials=trials, recommendation=recommendation)


def load_json(path: Path) -> CampaignView:
    """One JSON file: a lone trial (``servetune bench``) or a campaign's experiment.json."""
    data = _read_json(path)
    if not isinstance(data, dict):
        raise ReportInputError(f"{path}: expected a JSON object, got {type(data).__name__}")
    if data.get("schema") == TRIAL_SCHEMA:
        trial = _load_trial(path)
        experiment = {"experiment_id": trial.experiment_id, "model": trial.target.get("model"),
                      "engine": trial.target.get("engine")}
        return CampaignView(source=str(path), experiment=experiment, trials=[trial])
    if "experiment_id" in data and path.name == EXPERIMENT_FILE:
        return load_result_dir(path.parent)
    raise ReportInputError(
        f"{path}: neither a trial result (schema {TRIAL_SCHEMA!r}) nor a campaign's experiment.json "
        f"(schema={data.get('schema')!r})"
    )
