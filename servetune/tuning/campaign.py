"""A campaign: the pure decisions driven against a TrialRunner, written to a result folder.

Result folder (``servetune.experiment.ResultFolder``, shared with the warehouse loader and the report):
  OUT/experiment.json            experiment metadata, the plan, status, the recommendation
  OUT/state.json                 the CampaignState: every outcome so far
  OUT/trials/<trial_id>.json     every trial's TrialResult (stage and experiment_id set)
  OUT/recommendation.json        the recommendation, when there is one
experiment.json and state.json are rewritten after every trial, so an interrupted campaign still
says how far it got, and ``Campaign.resume`` picks it up there. Status: running | done | failed |
paused (stopped before a trial that would pass a time limit) | interrupted (a signal).
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from servetune.experiment import ExperimentRecord, ResultFolder
from servetune.oserrors import os_error_text
from servetune.plan import TuningPlan
from servetune.plan.protocols import MeasurementProtocol
from servetune.redact import MASK, redact
from servetune.result import TrialResult
from servetune.tuning.costs import (
    mean_trial_s,
    remaining_trials_upper_bound,
    restart_cost,
    restarts_left_upper_bound,
    trial_cost_s,
)
from servetune.tuning.decisions import next_trials
from servetune.tuning.plan_identity import check_same_plan, plan_digest, plan_fingerprints
from servetune.tuning.runner import RunReport, TrialRunner, failed_result
from servetune.tuning.state import CampaignState, Decision, Stage, TrialOutcome, TrialSpec
from servetune.validation.campaign import check_trial

log = logging.getLogger(__name__)
TRIGGERS = ("manual", "weekly", "on_change", "bench")


@dataclass
class Progress:
    """What the progress display gets before and after each trial."""

    event: str  # "start" | "end"
    spec: TrialSpec
    index: int  # 1-based trial number
    spent_s: float  # GPU seconds so far
    eta_s: float | None  # estimated GPU seconds left (upper bound)
    outcome: TrialOutcome | None = None


class Campaign:
    """Runs one plan to its recommendation, trial by trial, writing everything as it goes."""

    def __init__(
        self, plan: TuningPlan, runner: TrialRunner, out_dir: str | Path, *, trigger: str = "manual",
        dag_run_id: str | None = None, previous: dict[str, Any] | None = None,
        experiment_id: str | None = None, progress: Callable[[Progress], None] | None = None,
        checklist: bool = True,
    ) -> None:
        if trigger not in TRIGGERS:
            raise ValueError(f"trigger must be one of {TRIGGERS}, got {trigger!r}")
        plan = plan.with_repeats(getattr(runner, "default_repeats", 1))
        self.plan, self.runner, self.out = plan, runner, Path(out_dir)
        self.folder = ResultFolder(self.out)
        self.previous, self.progress, self.checklist = previous, progress, checklist
        self.state = CampaignState()
        self._ran_here = False
        model_fp, template_fp = plan_fingerprints(plan)
        self.experiment: ExperimentRecord = {
            "experiment_id": experiment_id or uuid.uuid4().hex,
            "model": plan.model,
            "engine": plan.engine.kind,
            "model_fingerprint": model_fp,
            "prompt_template_fingerprint": template_fp,
            "trigger": trigger,
            "dag_run_id": dag_run_id,
            "plan": redact(plan.model_dump(mode="json")),
            "plan_digest": plan_digest(plan),
            "status": "running",
            "started_at": datetime.now(UTC).isoformat(),
            "finished_at": None,
            "recommendation": None,
            "ceiling": None,
            "status_reason": None,
            "gpu_seconds": 0.0,
        }

    @property
    def experiment_id(self) -> str:
        return self.experiment["experiment_id"]

    @classmethod
    def resume(cls, plan: TuningPlan, runner: TrialRunner, out_dir: str | Path, **kwargs: Any) -> Campaign:
        """The campaign whose folder this is, with every trial recorded so far (state.json).

        Lets an orchestrator run the stages as separate tasks, and a retried task pick up where
        the last attempt stopped instead of measuring again.
        """
        campaign = cls(plan, runner, out_dir, **kwargs)
        folder = campaign.folder
        if folder.has_experiment():
            stored = folder.read_experiment()
            if stored.get("experiment_id") != campaign.experiment_id:
                raise ValueError(f"{out_dir} holds experiment {stored.get('experiment_id')}, "
                                 f"not {campaign.experiment_id}")
            check_same_plan(stored, campaign.plan, out_dir)  # as stored: its repeats resolved for the runner
            campaign.experiment.update(started_at=stored.get("started_at") or campaign.experiment["started_at"])
        state_json = folder.read_state_json()
        if state_json is not None:
            campaign.state = _with_secrets(_parse_state(state_json, folder.state_file), plan)
        return campaign

    def advance(self, stages: Iterable[Stage] | None = None, *, deadline: float | None = None,
                stop: Callable[[], bool] | None = None) -> Decision:
        """Run trials while the decisions ask for one of ``stages`` (all when None); the runner is
        always closed. Returns the first decision not run here (``done`` at the end).

        ``deadline`` (``time.monotonic()`` seconds): no trial starts whose expected cost would pass it,
        so a machine lent for a fixed time ends a campaign between trials, never inside one; the first
        trial of a call always runs, so a resumed campaign always moves on.

        ``stop``: asked before every trial and before the answer; True raises ``KeyboardInterrupt``. A
        signal handler that raises can be swallowed where Python ignores exceptions (a finaliser, an
        event-loop callback); the flag it also sets is never lost.
        """
        wanted = None if stages is None else set(stages)
        self.folder.create()
        self._write_experiment()
        try:
            while True:
                _stop_if(stop)
                decision = next_trials(self.plan, self.state, previous=self.previous)
                if decision.done or (wanted is not None and decision.stage not in wanted):
                    return decision
                for spec in decision.trials:
                    # never before this call's first trial: each call makes progress
                    late = deadline is not None and time.monotonic() + self.expected_cost_s(spec) > deadline
                    if late and self._ran_here:
                        return decision
                    _stop_if(stop)
                    self._run_one(spec, decision.stage)
        finally:
            self.runner.close()

    def conclude(self) -> Decision:
        """Write the outcome: the recommendation when the decisions are done, else a recorded failure
        naming the stage that never finished (an orchestrator task upstream failed)."""
        decision = next_trials(self.plan, self.state, previous=self.previous)
        self.runner.close()
        if decision.done:
            self._finish(decision, failed=decision.failed, reason=decision.reason)
        else:
            self._finish(None, failed=True, reason=f"campaign incomplete: the {decision.stage} stage did not finish")
        return decision

    def run(self, *, deadline: float | None = None, stop: Callable[[], bool] | None = None) -> Decision:
        """Loop decide -> run -> record until the decisions say done (or ``deadline``: paused);
        the runner is always closed, so a signal still tears the engine down."""
        try:
            self.run_protocols(stop=stop)
            decision = self.advance(deadline=deadline, stop=stop)
        except KeyboardInterrupt:
            self._finish(None, failed=True, reason="campaign interrupted by a signal; resume with --resume",
                         status="interrupted")
            raise
        except OSError as exc:  # the disk or the folder failed, not the campaign: it goes on once that is fixed
            self.experiment.update(status="interrupted", finished_at=datetime.now(UTC).isoformat(),
                                   status_reason=f"campaign interrupted: {os_error_text(exc)}; resume with --resume")
            with contextlib.suppress(OSError):  # the small file alone: a full disk may still take it; the
                self.folder.write_experiment(self.experiment)  # state on disk is the last trial's either way
            raise
        except BaseException as exc:
            self._finish(None, failed=True, reason=f"campaign aborted: {type(exc).__name__}: {exc}")
            raise
        if not decision.done:
            self._finish(None, failed=False, status="paused",
                         reason=f"paused before the next {decision.stage} trial: the time limit; resume with --resume")
            return decision
        self._finish(decision, failed=decision.failed, reason=decision.reason)
        return decision

    def run_protocols(self, *, stop: Callable[[], bool] | None = None) -> list[TrialResult]:
        """The plan's protocols (servetune.plan.protocols), each once, before the staged trials; one
        already in trials/ (a resumed campaign, a retried task) is not measured again. Their trials are
        results like any other (checked, stored, reported) but never outcomes the decisions read."""
        if not self.plan.protocols:  # most plans: no trial file is read
            return []
        done = {t.load.get("protocol", {}).get("name"): t for t in self.folder.read_trials() if t.stage == "protocol"}
        self.folder.create()
        self._write_experiment()
        out = []
        try:
            for p in self.plan.protocols:
                if p.name in done:
                    out.append(done[p.name])
                    continue
                _stop_if(stop)
                out.append(self._run_protocol(p))
        finally:
            self.runner.close()
        return out

    def _run_protocol(self, p: MeasurementProtocol) -> TrialResult:
        spec = TrialSpec(stage="protocol", protocol=p.name, concurrency=p.concurrency, requests=p.requests,
                         warmup=p.warmup, flags={**self.plan.engine_flags(), **p.flags},
                         reason=f"protocol {p.name}: {p.about}".rstrip(": "))
        if self.progress:
            self.progress(Progress("start", spec, 0, self.state.gpu_seconds, None))
        report = self._measure(spec, protocol={"name": p.name, "about": p.about, "headline": p.headline,
                                               "batching": p.batching})
        result = report.result
        self.experiment["protocols_gpu_seconds"] = round(
            float(self.experiment.get("protocols_gpu_seconds") or 0.0) + report.gpu_seconds, 3)
        self._write_experiment()
        if self.progress:
            outcome = TrialOutcome.from_result(spec, result, gpu_seconds=report.gpu_seconds, restarted=report.restarted,
                                           startup_seconds=report.startup_s)
            self.progress(Progress("end", spec, 0, self.state.gpu_seconds, None, outcome))
        return result

    def _measure(self, spec: TrialSpec, protocol: dict[str, Any] | None = None) -> RunReport:
        """Run ``spec`` (a broken trial is recorded, never raised), tag it with this campaign, write it."""
        try:
            report = self.runner.run(spec, experiment_id=self.experiment_id)
        except Exception as exc:  # noqa: BLE001 - a broken trial is recorded; the plan decides what follows
            log.exception("trial %s at %s failed", spec.stage, self.plan.level_text(spec.level))
            report = RunReport(failed_result(spec, f"{type(exc).__name__}: {exc}", experiment_id=self.experiment_id),
                               gpu_seconds=0.0, restarted=False)
        result = report.result
        result.stage, result.experiment_id, result.server_config = spec.stage, self.experiment_id, dict(spec.flags)
        if protocol is not None:
            result.load = {**result.load, "protocol": protocol}
        if self.checklist:
            check_trial(self.plan, result)
        self.folder.write_trial(result)
        return report

    def expected_cost_s(self, spec: TrialSpec) -> float:
        """Seconds the next trial should take: the mean measured trial so far (start-ups apart), plus a
        start-up when its flags differ from the last trial's (``restart_cost``: measured once there is one)."""
        return trial_cost_s(self.plan, self.state, spec, fresh=not self._ran_here)

    def _run_one(self, spec: TrialSpec, stage: str) -> TrialOutcome:
        index = len(self.state.outcomes) + 1
        eta = self._eta(stage)
        if self.progress:
            self.progress(Progress("start", spec, index, self.state.gpu_seconds, eta))
        report = self._measure(spec)
        self._ran_here = True
        result = report.result
        outcome = TrialOutcome.from_result(spec, result, gpu_seconds=report.gpu_seconds, restarted=report.restarted,
                                           startup_seconds=report.startup_s)
        self.state = self.state.add(outcome)
        self.experiment["gpu_seconds"] = round(self.state.gpu_seconds, 3)
        self._write_experiment()
        if self.progress:
            self.progress(Progress("end", spec, index, self.state.gpu_seconds, self._eta(stage), outcome))
        return outcome

    def _eta(self, stage: str) -> float | None:
        done = [o for o in self.state.outcomes if o.stage != "correctness"]
        if not done:
            return None
        return mean_trial_s(self.state) * remaining_trials_upper_bound(self.plan, self.state, stage) \
            + restart_cost(self.plan, self.state) * restarts_left_upper_bound(self.plan, self.state)

    def _finish(self, decision: Decision | None, *, failed: bool, reason: str, status: str | None = None) -> None:
        rec = decision.recommendation if decision else None
        ceiling = decision.ceiling if decision else None
        self.experiment.update(
            status=status or ("failed" if failed else "done"),
            finished_at=datetime.now(UTC).isoformat(),
            recommendation=redact(rec.model_dump(mode="json")) if rec else None,
            ceiling=({"concurrency": None if self.plan.rate_mode else ceiling.level,
                      **({"rate": ceiling.level} if self.plan.rate_mode else {}),
                      **ceiling.model_dump(mode="json", exclude={"level"})} if ceiling else None),
            status_reason=reason,
        )
        if rec is not None:
            self.folder.write_recommendation(redact(rec.model_dump(mode="json")))
        self._write_experiment()

    def _write_experiment(self) -> None:
        self.folder.write_state(redact(self.state.model_dump(mode="json")))
        self.folder.write_experiment(self.experiment)


def _stop_if(stop: Callable[[], bool] | None) -> None:
    """``KeyboardInterrupt`` when the caller's flag says a signal came (see ``Campaign.advance``)."""
    if stop is not None and stop():
        raise KeyboardInterrupt("stop requested")


def _parse_state(raw: bytes, path: Path) -> CampaignState:
    """The stored state, or one line that says it is damaged (written whole each time, so only a hand or a
    broken disk cuts it short) and what is still there."""
    try:
        return CampaignState.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(k) for k in first["loc"])
        raise ValueError(f"{path} is damaged ({first['msg']}{' at ' + where if where else ''}), so the campaign"
                         f" cannot go on from it; its trial files are kept in {path.parent / 'trials'}: start"
                         " the campaign again in a new folder") from None


def _with_secrets(state: CampaignState, plan: TuningPlan) -> CampaignState:
    """state.json keeps secret flags as ``***``; the plan (the only source of secrets) puts them back, so a
    resumed campaign matches its trials to the live configs and relaunches with the real values."""
    real = plan.engine_flags()

    def back(flags: dict[str, Any]) -> dict[str, Any]:
        return {k: real[k] if v == MASK and k in real else v for k, v in flags.items()}

    return CampaignState(outcomes=[o.model_copy(update={"flags": back(o.flags)}) for o in state.outcomes])


def run_campaign(plan: TuningPlan, runner: TrialRunner, out_dir: str | Path, **kwargs: Any) -> Decision:
    return Campaign(plan, runner, out_dir, **kwargs).run()


def dry_run(plan: TuningPlan, runner: TrialRunner, *, max_trials: int = 500, checklist: bool = True,
            previous: dict[str, Any] | None = None) -> tuple[Decision, list[TrialOutcome], list[TrialSpec]]:
    """The whole campaign against a (simulated) runner, in memory: what it would run, and the answer; each
    trial through the checklist first, as in a real campaign (``checklist=False``: the validity rules only)."""
    plan = plan.with_repeats(getattr(runner, "default_repeats", 1))
    state = CampaignState()
    specs: list[TrialSpec] = []
    try:
        for _ in range(max_trials):
            decision = next_trials(plan, state, previous=previous)
            if decision.done:
                return decision, state.outcomes, specs
            for spec in decision.trials:
                report = runner.run(spec, experiment_id="dry-run")
                if checklist:
                    check_trial(plan, report.result)
                specs.append(spec)
                state = state.add(TrialOutcome.from_result(spec, report.result, gpu_seconds=report.gpu_seconds,
                                                           restarted=report.restarted,
                                                           startup_seconds=report.startup_s))
    finally:
        runner.close()
    raise RuntimeError(f"the campaign did not finish within {max_trials} trials")
