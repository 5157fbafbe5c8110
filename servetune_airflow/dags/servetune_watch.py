"""servetune_watch: fingerprint every plan's model and prompt template; emit an Asset event on change.

Each asset has its own task whose outlet is that asset; the task skips (so emits nothing) unless the
fingerprint differs from the last one stored in the warehouse. servetune_on_change is scheduled on
these assets.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, task
from airflow.sdk.exceptions import AirflowSkipException

from servetune_airflow.campaign_group import DEFAULT_ARGS
from servetune_airflow.config import warehouse_url
from servetune_airflow.watch import check_asset, plan_assets

with DAG(
    dag_id="servetune_watch",
    description="Fingerprint models and prompt templates; Asset events only on a real change",
    schedule=timedelta(minutes=30),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,  # a check cut by a restart is retried once Airflow is back
    tags=["servetune"],
    doc_md=__doc__,
):
    for pair in plan_assets().values():
        for asset in pair:
            @task(task_id=f"watch__{asset.name}", outlets=[asset])
            def watch(uri: str = asset.uri, source: str = asset.extra["source"]) -> dict:
                change = check_asset(uri, source, warehouse_url())
                if not change["changed"]:
                    raise AirflowSkipException(f"{uri}: unchanged ({change['digest']})")
                return change

            watch()
