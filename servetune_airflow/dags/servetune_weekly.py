"""servetune_weekly: every Monday (``SERVETUNE_WEEKLY_CRON``), one tuning campaign per plan in the plans folder.

One mapped task group per GPU runner (its pool keeps trials from sharing a GPU, its queue sends
them to that GPU host's worker), mapped over the runner's plans. Trigger it by hand with the
Params form to run chosen plans or to override plan fields.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, DeadlineAlert, DeadlineReference, SyncCallback
from airflow.sdk.definitions.timetables.trigger import CronTriggerTimetable

from servetune_airflow.alerts import deadline_missed, gpu_window
from servetune_airflow.campaign_group import DEFAULT_ARGS, PARAMS, campaigns_per_runner, list_plans
from servetune_airflow.config import weekly_cron

WINDOW = gpu_window()
CRON = weekly_cron()

with DAG(
    dag_id="servetune_weekly",
    description="Weekly staged tuning campaign per plan (SGLang and friends), results to the warehouse",
    # the first run waits for the next tick: Airflow 3.3.2 reads run_immediately=False like None (the last tick
    # runs at once if it is under a tenth of the interval old: 16.8 h for a weekly cron; apache/airflow#64162),
    # a zero timedelta is "never the past one"
    schedule=CronTriggerTimetable(CRON, timezone="UTC", run_immediately=timedelta(0)) if CRON else None,
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    params=PARAMS,
    tags=["servetune"],
    # a run still going when its GPU window ends tells the notifiers (servetune_airflow.alerts)
    deadline=DeadlineAlert(reference=DeadlineReference.DAGRUN_QUEUED_AT, interval=WINDOW,
                           callback=SyncCallback(deadline_missed,
                                                 kwargs={"window_minutes": WINDOW.total_seconds() / 60}))
    if WINDOW else None,
    doc_md=__doc__,
):
    campaigns_per_runner(list_plans)
