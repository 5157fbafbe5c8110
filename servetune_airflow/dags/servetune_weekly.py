"""servetune_weekly: every Monday (``SERVETUNE_WEEKLY_CRON``), one tuning campaign per plan in the plans folder.

One mapped task group per GPU runner (its pool keeps trials from sharing a GPU, its queue sends
them to that GPU host's worker), mapped over the runner's plans. Trigger it by hand with the
Params form to run chosen plans or to override plan fields.
"""

from __future__ import annotations

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
    # no start_date and run_immediately=False, meant to make unpausing wait for the next tick; seen under Airflow
    # 3.3.2 (2026-12-07): unpaused at 04:55 on a Monday, the 04:00 run started at once (next_dagrun 04:00)
    schedule=CronTriggerTimetable(CRON, timezone="UTC", run_immediately=False) if CRON else None,
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
