"""servetune_on_change: re-tune when a model or a prompt template changes.

Scheduled on the Assets the watcher (servetune_watch) updates: any plan's model or prompt template.
Only the plans that use a changed asset run. By hand (Params form) it runs the plans it is given.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, AssetAny, get_current_context, task

from servetune_airflow.campaign_group import DEFAULT_ARGS, PARAMS, campaigns_per_runner
from servetune_airflow.watch import plan_assets, plans_using


@task
def changed_plans(runner_name: str) -> list[str]:
    """Plans of this runner that use an asset named by the triggering events (or the Params' plans)."""
    ctx = get_current_context()
    uris = [ev.asset.uri for evs in ctx["triggering_asset_events"].values() for ev in evs] \
        if ctx.get("triggering_asset_events") else []
    return plans_using(uris, runner_name, chosen=ctx["params"].get("plans") or [])


assets = [a for pair in plan_assets().values() for a in pair]

with DAG(
    dag_id="servetune_on_change",
    description="Re-tune the plans whose model or prompt template changed",
    schedule=AssetAny(*assets) if assets else None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    default_args=DEFAULT_ARGS,
    params=PARAMS,
    tags=["servetune"],
    doc_md=__doc__,
):
    campaigns_per_runner(changed_plans, trigger="on_change")
