"""The task bodies of a campaign, one servetune call each; the DAGs wrap them with @task.

Each function takes and returns small JSON-able dicts (they travel through XCom) and is safe to
retry: the campaign state is the result folder (trials on disk), so a retried stage resumes where
it stopped, and warehouse loads are idempotent on the trial id. Nothing here imports Airflow, so
every step can also be called (and tested) without it.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from servetune.experiment import ResultFolder
from servetune.plan import PlanError, TuningPlan, load_plan, parse_plan
from servetune.plan.protocols import deep_merge
from servetune.tuning.runner import SimTrialRunner
from servetune_airflow.config import results_dir, runner_of
from servetune_airflow.task_logs import quiet_libraries

if TYPE_CHECKING:
    from servetune.tuning.state import Stage

log = logging.getLogger(__name__)
quiet_libraries()  # imported by every task process before its body runs

# Stage task (a DAG task id) -> the decision stages it runs (servetune.tuning.state.Stage names them): its
# own and every earlier one, since a later stage can re-open an earlier one's measurement (a re-run that grows
# a level's trial size makes the ramp's trials there stale), and the earlier tasks have already ended.
_OWN: dict[str, tuple[Stage, ...]] = {
    "correctness": ("correctness",),
    "baseline": ("baseline",),
    "ramp": ("ramp", "bisect"),
    "refine": ("refine", "robustness"),
}
STAGES: dict[str, tuple[Stage, ...]] = {
    task: tuple(s for earlier in list(_OWN)[: i + 1] for s in _OWN[earlier]) for i, task in enumerate(_OWN)
}


def experiment_id_for(plan_file: str, run_id: str) -> str:
    """Stable per (plan, DAG run): a retried or re-run task finds the same experiment."""
    return hashlib.sha256(f"{Path(plan_file).resolve()}\0{run_id}".encode()).hexdigest()[:24]


def _exp_dir(exp: dict[str, Any]) -> Path:
    return Path(exp["out_dir"])


def _plan(exp: dict[str, Any]) -> TuningPlan:
    return load_plan(Path(exp["out_dir"]) / "plan.yaml")


def prepare(plan_file: str, *, trigger: str, run_id: str, overrides: dict[str, Any] | None = None,
            results_root: str | None = None, load_mode: str = "plan", clock: str = "live") -> dict[str, Any]:
    """Validate the plan (with the run's overrides and load mode) before any GPU is touched; fix the
    experiment id. ``load_mode`` rate or concurrency sets ``load.mode`` (the overrides can still set the rest).
    ``clock`` virtual answers every trial in the simulator's virtual time (a sim plan, or one with ``estimate``)."""
    import yaml

    plan = load_plan(plan_file)
    if load_mode != "plan":
        overrides = deep_merge({"load": {"mode": load_mode}}, overrides or {})
    if overrides:
        data = plan.model_dump(mode="json")
        if "load" in overrides and not data.get("load"):
            data["load"] = {}  # a plan without a load section: its defaults, under the override
        plan = parse_plan(deep_merge(data, overrides), source=f"{plan_file} + overrides")
    if clock == "virtual" and SimTrialRunner.for_plan(plan) is None:
        raise PlanError(f"{plan_file}: clock virtual needs engine.kind sim or an `estimate:` section in the plan")
    exp_id = experiment_id_for(plan_file, run_id)
    out = Path(results_root or results_dir()) / exp_id
    out.mkdir(parents=True, exist_ok=True)
    # the whole plan (secrets included: the later tasks launch from it), readable by its owner only
    fd = os.open(out / "plan.yaml", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(yaml.safe_dump(plan.model_dump(mode="json"), sort_keys=False))
    os.chmod(out / "plan.yaml", 0o600)
    return {"experiment_id": exp_id, "out_dir": str(out), "plan_file": str(plan_file), "plan_name": plan.name,
            "trigger": trigger, "run_id": run_id, "runner": runner_of(plan).name, "clock": clock}


PREVIOUS_FILE = "previous.json"


def find_previous(exp: dict[str, Any], warehouse_url: str) -> dict[str, Any]:
    """The last accepted answer for the same service (servetune.warehouse.previous), kept beside the plan for
    the campaign to diff against. A warehouse that cannot answer leaves the campaign without one, said in
    the log: the measurement matters more than the comparison."""
    from sqlalchemy.exc import SQLAlchemyError

    from servetune.warehouse.db import WarehouseUnavailable
    from servetune.warehouse.previous import last_accepted

    plan = _plan(exp)
    try:
        prev = last_accepted(plan, warehouse_url, exclude=exp["experiment_id"])
    except (WarehouseUnavailable, SQLAlchemyError) as exc:
        log.warning("not compared with a previous answer: the warehouse did not answer (%s)",
                    str(exc).splitlines()[0][:300])
        return {"previous": None}
    if prev is None:
        log.info("no accepted answer for %s in the warehouse yet: this campaign is the first", plan.model)
        return {"previous": None}
    (_exp_dir(exp) / PREVIOUS_FILE).write_bytes(orjson.dumps(prev.as_previous()))
    alike = "like for like" if not prev.changed else "not like for like: " + ", ".join(prev.changed) + " differ"
    log.info("compared with experiment %s of %s (%s)", prev.experiment_id, prev.started_at, alike)
    return {"previous": prev.experiment_id, "changed": prev.changed}


def provision(exp: dict[str, Any]) -> dict[str, Any]:
    """The clean-environment preflight of the plan's GPU runner: a dirty runner fails here, before trials.

    Local runners are checked here; remote ones (ssh, kubernetes) are checked on the host by the runner
    itself at every server start.
    """
    from servetune.runners.preflight import check_clean

    plan = _plan(exp)
    if exp.get("clock") == "virtual":
        return {"runner": exp["runner"], "preflight": "virtual time: no server is started"}
    if plan.runner.kind != "local" or not plan.engine.launches:
        return {"runner": exp["runner"], "preflight": f"checked by the {plan.runner.kind} runner at each start"}
    report = check_clean(host=plan.runner.host, port=None, gpus=plan.runner.gpus,
                         idle_mib=plan.runner.gpu_idle_mib)
    if plan.runner.check_clean:
        report.raise_if_dirty()
    return {"runner": exp["runner"], "preflight": {"ok": report.ok, "gpu": report.gpu, "problems": report.problems}}


#: how long an attempt waits for an earlier one of the same campaign that outlived an Airflow restart (a killed
#: scheduler leaves its task processes running): that one finishes its stage and exits, this one then resumes
LOCK_WAIT_S = 6 * 3600.0
#: how long teardown waits for a stage task Airflow is stopping (a run marked failed) to let go of the folder
TEARDOWN_LOCK_WAIT_S = 300.0


@contextmanager
def _sole_runner(exp: dict[str, Any]) -> Iterator[None]:
    """The campaign folder's lock (servetune.campaign_lock), held while this task reads state and runs trials.
    Holding it, no other attempt of this campaign lives: an engine it owns is a dead attempt's, and goes."""
    from servetune.campaign_lock import campaign_lock
    from servetune.runners.sweep import sweep

    def waiting(holder: str) -> None:
        log.warning("waiting for %s: an earlier attempt still runs this campaign (orphaned by a restart);"
                    " this one resumes from what it finishes", holder)

    with campaign_lock(_exp_dir(exp), wait_s=LOCK_WAIT_S, on_wait=waiting):
        if stopped := sweep(exp["experiment_id"]):
            log.warning("stopped the engine an earlier attempt left running (pids %s)",
                        ", ".join(map(str, stopped)))
        yield


def _campaign(exp: dict[str, Any]):
    from servetune.tuning.campaign import Campaign
    from servetune.tuning.live import LiveTrialRunner
    from servetune.tuning.progress import line_printer

    plan = _plan(exp)
    if exp.get("clock") == "virtual":
        runner = SimTrialRunner.for_plan(plan)
    else:
        runner = LiveTrialRunner(plan, log_dir=_exp_dir(exp) / "logs", owner=exp["experiment_id"])
    previous_file = _exp_dir(exp) / PREVIOUS_FILE
    previous = orjson.loads(previous_file.read_bytes()) if previous_file.is_file() else None
    campaign: Campaign | None = None
    progress = line_printer(plan, lambda line: log.info("%s", line), lambda: campaign.state)  # type: ignore[union-attr]
    campaign = Campaign.resume(plan, runner, _exp_dir(exp), trigger=exp["trigger"], dag_run_id=exp["run_id"],
                               experiment_id=exp["experiment_id"], progress=progress, previous=previous)
    return campaign


def run_protocols(exp: dict[str, Any]) -> dict[str, Any]:
    """The plan's other ways of measuring the same server, once each (none: nothing to do)."""
    with _sole_runner(exp):
        results = _campaign(exp).run_protocols()
    return {"protocols": [{"name": r.load.get("protocol", {}).get("name"), "trial_id": r.trial_id,
                           "status": r.status} for r in results]}


def run_stage(exp: dict[str, Any], task: str) -> dict[str, Any]:
    """Run the trials the decisions ask for while they belong to this stage task."""
    with _sole_runner(exp):
        campaign = _campaign(exp)
        before = len(campaign.state.outcomes)
        decision = campaign.advance(stages=STAGES[task])
    ran = len(campaign.state.outcomes) - before
    log.info("stage %s: %d trial(s) run here, %d in the campaign; next: %s (%s)", task, ran,
             len(campaign.state.outcomes), "done" if decision.done else decision.stage, decision.reason)
    return {"stage": task, "trials": len(campaign.state.outcomes), "next": decision.stage,
            "reason": decision.reason}


def recommend(exp: dict[str, Any]) -> dict[str, Any]:
    """Close the campaign: the recommendation when the decisions are done, else a recorded failure."""
    with _sole_runner(exp):
        campaign = _campaign(exp)
        decision = campaign.conclude()
    rec = decision.recommendation.model_dump(mode="json") if decision.recommendation else None
    log.info("campaign %s: %s (%s)", campaign.plan.name, campaign.experiment["status"],
             campaign.experiment.get("status_reason") or decision.reason)
    return {"status": campaign.experiment["status"], "reason": campaign.experiment.get("status_reason"),
            "recommendation": rec}


def validate(exp: dict[str, Any]) -> dict[str, Any]:
    """The report checklist on every trial; a failing trial is kept and marked rejected."""
    from servetune.validation.campaign import validate_campaign

    plan = _plan(exp)
    counts = validate_campaign(_exp_dir(exp), min_measured=plan.validation.min_measured,
                               waive=plan.validation.waive)
    return counts


def load(exp: dict[str, Any], warehouse_url: str) -> dict[str, Any]:
    """Everything into the warehouse, one transaction per trial, idempotent (safe to retry)."""
    from servetune.warehouse import load_result  # the checklist already ran in the validate task

    report = load_result(warehouse_url, _exp_dir(exp))
    if report.errors:
        raise RuntimeError(f"warehouse load of {exp['experiment_id']}: {len(report.errors)} trial(s) failed: "
                           + "; ".join(map(str, report.errors))[:2000])
    if report.accepted:
        log.info("accepted as the baseline: %s", report.accepted)
    if report.awaits:
        log.info("the answer awaits acceptance (the approve task or `servetune accept %s`): %s",
                 report.experiment_id, report.awaits)
    return {"experiment_id": report.experiment_id, "trials": len(report.trials),
            "inserted": sum(1 for t in report.trials if t.action == "inserted"),
            "plan_name": report.plan_name, "accepted": report.accepted, "awaits": report.awaits}


def report(exp: dict[str, Any]) -> str:
    """The HTML report of the campaign, beside its results."""
    from servetune.report.html import write_report
    from servetune.report.sources import load_campaign

    folder = ResultFolder(_exp_dir(exp))
    return str(write_report(load_campaign(str(folder.path)), folder.report_dir).html_path)


class CampaignFailed(RuntimeError):
    """The campaign ended without an answer: its DAG run must be red (Airflow's alerts and callbacks fire)."""


class CampaignRegressed(CampaignFailed):
    """The answer fell behind the last accepted one beyond the noise: red too, so the alert hook fires."""


def outcome(exp: dict[str, Any]) -> dict[str, Any]:
    """The campaign's end state, after its results are validated, loaded and reported: raises
    ``CampaignFailed`` with the one-line reason unless it concluded ``done``, and ``CampaignRegressed`` when
    its answer fell behind the last accepted one beyond the noise (servetune.tuning.regressions)."""
    folder = ResultFolder(_exp_dir(exp))
    data = folder.read_experiment() if folder.has_experiment() else {}
    status = data.get("status") or "never started"
    if status != "done":
        reason = data.get("status_reason") or ("the DAG run ended before the campaign concluded"
                                               if status == "running" else "no reason recorded")
        name = (data.get("plan") or {}).get("name") or exp.get("experiment_id")
        raise CampaignFailed(f"campaign {name} {status}: {reason}")
    name = (data.get("plan") or {}).get("name")
    diff = (data.get("recommendation") or {}).get("diff_from_previous") or {}
    if found := diff.get("regressions"):
        against = (diff.get("against") or {}).get("experiment_id") or "the previous answer"
        raise CampaignRegressed(f"campaign {name} regressed against {against}: "
                                + "; ".join(r["why"] for r in found))
    log.info("campaign %s done%s", name, ", no regression against " + diff["against"]["experiment_id"]
             if diff.get("against") else "")
    return {"status": status}


def teardown(exp: dict[str, Any], *, stopped_from_outside: bool = False) -> dict[str, Any]:
    """Always runs: no server of this experiment may outlive the run, and an unfinished one is marked failed.

    ``stopped_from_outside``: the run was marked failed mid-campaign (its verdict skipped), so a paused campaign
    is unfinished too. A stage task Airflow is still stopping may be writing the folder: its lock is waited for
    (bounded), so the mark is the last write."""
    from servetune.campaign_lock import CampaignBusy, campaign_lock
    from servetune.runners.sweep import sweep

    folder = ResultFolder(_exp_dir(exp))
    with ExitStack() as held:
        try:
            held.enter_context(campaign_lock(folder.path, wait_s=TEARDOWN_LOCK_WAIT_S, on_wait=lambda who: log.warning(
                "waiting for %s to stop before tearing down", who)))
        except CampaignBusy as exc:  # its engine goes anyway; the holder's trial then fails
            log.warning("%s; tearing down without waiting longer", exc)
        stopped = sweep(exp["experiment_id"])
        status = None
        if folder.has_experiment():
            data = folder.read_experiment()
            if data.get("status") == "running" or (stopped_from_outside and data.get("status") == "paused"):
                why = ("the DAG run was marked failed before the campaign concluded" if stopped_from_outside
                       else "the DAG run ended before the campaign concluded")
                data.update(status="failed", status_reason=why)
                folder.write_experiment(data)
            status = data.get("status")
    return {"stopped_servers": stopped, "status": status}
