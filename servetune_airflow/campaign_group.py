"""The campaign as an Airflow task group: prepare -> provision -> protocols -> stages -> recommend -> validate ->
load -> report -> outcome (red unless the campaign concluded) beside teardown (always runs, red when the run
ended before the campaign concluded); after load, approve
(servetune_airflow.approval) asks a person when the answer needs one. One group per GPU runner,
mapped over that runner's plans.

Every task of a runner's group sits in the runner's pool (one slot: no two trials share a GPU) and on
its Celery queue (one queue per GPU type, a worker on each GPU host).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import Param, get_current_context, task, task_group
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from servetune.plan import PlanError, load_plan
from servetune_airflow import tasks
from servetune_airflow.alerts import gpu_window, notify_failure, past_its_window
from servetune_airflow.approval import AnswerApproval
from servetune_airflow.config import GpuRunner, plan_files, plans_dir, runner_of, runners, warehouse_url

log = logging.getLogger(__name__)

# Retries that outlive an Airflow restart: a killed scheduler or worker orphans the running task, whose retry
# must find the API server back (about 2 minutes on a small host), so 1, 2 then 4 minutes apart; a stage task
# resumes from the campaign state on disk and a load is idempotent, so a retry never repeats a trial.
DEFAULT_ARGS = {"retries": 3, "retry_delay": timedelta(minutes=1), "retry_exponential_backoff": 2.0,
                "max_retry_delay": timedelta(minutes=10)}

PARAMS = {
    "plans": Param([], type="array", items={"type": "string"},
                   description="plan files to run (empty: every plan in the plans folder)"),
    "overrides": Param({}, type="object",
                       description="deep-merged into every plan, e.g. {\"sla\": {\"p99_ttft_ms\": 300}}"),
    "load_mode": Param("plan", type="string", enum=["plan", "concurrency", "rate"],
                       description="plan: each plan's own load; rate: open-loop arrivals, the ramp's levels read as"
                                   " requests/s and the answer a capacity at the SLA; concurrency: closed loop"),
    "clock": Param("live", type="string", enum=["live", "virtual"],
                   description="live: real servers over HTTP; virtual: every trial in the simulator's virtual time"
                               " (plans with engine kind sim or an estimate section), seconds per campaign"),
    "approval": Param("ask", type="string", enum=["ask", "off"],
                      description="ask: an answer servetune does not accept by itself (a regression, other flags or"
                                  " level) waits for Approve/Reject in the approve task; off: `servetune accept`"
                                  " decides (`airflow dags test` needs off: only an api-server takes the answer)"),
}


@task
def list_plans(runner_name: str, chosen: list[str] | None = None, from_events: bool = False) -> list[str]:
    """The plans of this GPU runner: the ones a manual run names, else every plan in the folder; none for a
    scheduled run that starts past its GPU window (skipped, with why)."""
    ctx = get_current_context()
    run = ctx["dag_run"]
    late = past_its_window(str(getattr(run, "run_type", "")), getattr(run, "run_after", None),
                           datetime.now(UTC), gpu_window())
    if late:
        log.warning("%s", late)  # the skip's own line says only 'Skipping task.'
        raise AirflowSkipException(late)
    names = list(chosen if chosen is not None else ctx["params"].get("plans") or [])
    files = [Path(n) if Path(n).is_absolute() else plans_dir() / n for n in names] or plan_files()
    return [str(f) for f in files if _runner_name(f) == runner_name]


def _runner_name(plan_file: Path) -> str:
    """The plan's GPU runner; a plan that does not parse goes to the local runner's group, where its own
    prepare task fails it with the field path and no retry, and every other plan still runs."""
    try:
        return runner_of(load_plan(plan_file)).name
    except PlanError:
        return "local"


def _verdict_skipped() -> bool:
    """Whether this group's outcome task was skipped: Airflow skips the pending tasks of a run marked failed
    from outside (and still runs its teardowns); nothing else skips outcome, which runs whatever came before."""
    ti = get_current_context()["ti"]
    outcome_id = ti.task_id.rsplit(".", 1)[0] + ".outcome"
    try:
        found = ti.get_task_states(dag_id=ti.dag_id, map_index=ti.map_index, task_ids=[outcome_id],
                                   run_ids=[ti.run_id])
    except Exception as exc:  # noqa: BLE001 - not knowing keeps the teardown green, as before
        log.warning("could not read %s's state: %s", outcome_id, exc)
        return False
    return any(state == "skipped" for states in found.values() for state in states.values())


def _trigger() -> str:
    ctx = get_current_context()
    run_type = str(getattr(ctx["dag_run"], "run_type", "manual")).lower()
    if "asset" in run_type:
        return "on_change"
    return "weekly" if "scheduled" in run_type else "manual"


#: a mapped instance shows its plan's name in the UI, not [0], [1] (each task body sets ``plan_name``)
NAMED = {"map_index_template": "{{ plan_name }}"}


def _named(exp: dict[str, Any]) -> dict[str, Any]:
    get_current_context()["plan_name"] = exp.get("plan_name") or Path(exp.get("plan_file", "?")).stem  # type: ignore[typeddict-unknown-key]
    return exp


def task_suffix(runner: GpuRunner) -> str:
    """A runner's name as Airflow task and group ids take it (``ssh-gpu-7`` -> ``ssh_gpu_7``)."""
    return runner.name.replace("-", "_")


def campaigns_per_runner(plans_task, *, trigger: str | None = None) -> None:  # noqa: ANN001 - an Airflow @task
    """Inside a DAG: for each GPU runner, ``plans_task`` (called with the runner's name) lists its plans and one
    campaign group runs per plan, mapped; the weekly and the on-change DAGs differ only in that task."""
    for runner in runners().values():
        plans = plans_task.override(task_id=f"plans_{task_suffix(runner)}")(runner.name)
        campaign_group(runner, trigger=trigger).expand(plan_file=plans)


def campaign_group(runner: GpuRunner, *, trigger: str | None = None):
    """A task group factory for one GPU runner; call the result with ``.expand(plan_file=...)``."""
    where: dict[str, Any] = {"pool": runner.pool, "queue": runner.queue, **NAMED}

    @task(**where)
    def prepare(plan_file: str) -> dict[str, Any]:
        ctx = get_current_context()
        _named({"plan_file": plan_file})
        try:
            exp = tasks.prepare(plan_file, trigger=trigger or _trigger(), run_id=ctx["run_id"],
                                overrides=ctx["params"].get("overrides") or {},
                                load_mode=ctx["params"].get("load_mode") or "plan",
                                clock=ctx["params"].get("clock") or "live")
        except PlanError as exc:  # a bad plan stays bad: no retry, the message names the field
            raise AirflowFailException(str(exc)) from None
        tasks.find_previous(exp, warehouse_url())  # the answer this week's is compared with
        return _named(exp)

    @task(**where)
    def provision(exp: dict[str, Any]) -> dict[str, Any]:
        return tasks.provision(_named(exp))

    @task(**where)
    def protocols(exp: dict[str, Any]) -> dict[str, Any]:
        return tasks.run_protocols(_named(exp))

    def stage(name: str):
        @task(task_id=name, **where)
        def run(exp: dict[str, Any]) -> dict[str, Any]:
            return tasks.run_stage(_named(exp), name)

        return run

    @task(**where, trigger_rule="all_done")
    def recommend(exp: dict[str, Any]) -> dict[str, Any]:
        return tasks.recommend(_named(exp))

    @task(trigger_rule="all_done", **NAMED)
    def validate(exp: dict[str, Any]) -> dict[str, int]:
        return tasks.validate(_named(exp))

    @task(trigger_rule="all_done", **NAMED)
    def load(exp: dict[str, Any]) -> dict[str, Any]:
        from servetune.warehouse.migrate import SchemaMismatch

        try:
            return tasks.load(_named(exp), warehouse_url())
        except SchemaMismatch as exc:  # a retry cannot migrate the warehouse: red at once, saying what to run
            raise AirflowFailException(str(exc)) from None

    @task(trigger_rule="all_done", **NAMED)
    def report(exp: dict[str, Any]) -> str:
        return tasks.report(_named(exp))

    @task(trigger_rule="all_done", retries=0, on_failure_callback=notify_failure, **NAMED)
    def outcome(exp: dict[str, Any]) -> dict[str, Any]:
        try:
            return tasks.outcome(_named(exp))
        except tasks.CampaignFailed as exc:  # the run goes red with the reason; retrying cannot change it
            raise AirflowFailException(str(exc)) from None

    @task(**where, retries=2)
    def teardown(exp: dict[str, Any]) -> dict[str, Any]:
        stopped = _verdict_skipped()
        done = tasks.teardown(_named(exp), stopped_from_outside=stopped)
        if stopped:  # Airflow ran this teardown of a run marked failed mid-campaign: it stays red
            raise AirflowFailException(f"campaign {exp.get('plan_name') or exp.get('experiment_id')}: the DAG run"
                                       f" was marked failed before its verdict (campaign {done['status']}, its"
                                       f" servers stopped: {done['stopped_servers']})")
        return done

    @task_group(group_id=f"campaign_{task_suffix(runner)}")
    def campaign(plan_file: str) -> None:
        exp = prepare(plan_file)
        ready = provision(exp)
        steps = [protocols(exp), *(stage(name)(exp) for name in tasks.STAGES)]
        done = recommend(exp)
        checked = validate(exp)
        stored = load(exp)
        html = report(exp)
        verdict = outcome(exp)
        end = teardown(exp)
        # no pool: a question waits days without holding the GPU runner's slot, and teardown never waits for it
        AnswerApproval(task_id="approve", loaded=stored, retries=0, **NAMED)  # a person answers once
        ready >> steps[0]
        for a, b in zip(steps, steps[1:], strict=False):
            a >> b
        # outcome and teardown side by side, both leaves: a teardown that can fail the run (a run stopped from
        # outside) makes every task upstream of it no leaf, so an outcome before it would no longer colour the run
        steps[-1] >> done >> checked >> stored >> html >> [verdict, end]
        end.as_teardown(setups=ready, on_failure_fail_dagrun=True)  # a run stopped mid-campaign stays red

    return campaign
