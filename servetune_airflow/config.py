"""Where the DAGs find plans and write results; the GPU runners (pools, queues) of the plans there
(servetune.gpu_pools names them).

Read at DAG-parse time, so it stays cheap: plan files are parsed, no server is contacted.
"""

from __future__ import annotations

import os
from pathlib import Path

from servetune import gpu_pools as pools
from servetune.gpu_pools import GpuRunner, runner_of

__all__ = ["WAREHOUSE_CONN_ID", "GpuRunner", "plan_files", "plans_dir", "results_dir", "runner_of", "runners",
           "warehouse_url", "weekly_cron"]

REPO = Path(__file__).resolve().parents[1]
WAREHOUSE_CONN_ID = "servetune_warehouse"
#: when servetune_weekly runs: Mondays 04:00 UTC, unless SERVETUNE_WEEKLY_CRON says otherwise
WEEKLY_CRON = "0 4 * * 1"


def _installed_home() -> Path | None:
    """$AIRFLOW_HOME/servetune for an installed wheel (it has no plans/ beside it); None in a checkout."""
    if (REPO / "pyproject.toml").is_file():
        return None
    return Path(os.environ.get("AIRFLOW_HOME", Path.home() / "airflow")) / "servetune"


def plans_dir() -> Path:
    home = _installed_home()
    default = home / "plans" if home else REPO / "plans" / "weekly"
    return Path(os.environ.get("SERVETUNE_PLANS_DIR", default))


def results_dir() -> Path:
    home = _installed_home()
    default = home / "results" if home else REPO / ".servetune" / "results"
    return Path(os.environ.get("SERVETUNE_RESULTS_DIR", default))


def weekly_cron() -> str | None:
    """The weekly DAG's cron in UTC (``SERVETUNE_WEEKLY_CRON``: the team's GPU window, e.g. ``0 22 * * 5``);
    ``off`` (or empty) for no schedule: runs are triggered by hand or over the REST API only."""
    cron = os.environ.get("SERVETUNE_WEEKLY_CRON", WEEKLY_CRON).strip()
    return None if cron.lower() in ("", "off", "none") else cron


def plan_files(folder: Path | None = None) -> list[Path]:
    return pools.plan_files(folder or plans_dir())


def runners(folder: Path | None = None) -> dict[str, GpuRunner]:
    return pools.runners(folder or plans_dir())


def warehouse_url() -> str:
    """The warehouse from the Airflow connection (password never logged), else SERVETUNE_DATABASE_URL."""
    from airflow.sdk import Connection

    try:
        uri = Connection.get(WAREHOUSE_CONN_ID).get_uri()
    except Exception:  # noqa: BLE001 - no such connection: fall back to the environment
        uri = os.environ.get("SERVETUNE_DATABASE_URL", "")
    if not uri:
        raise RuntimeError(f"no Airflow connection {WAREHOUSE_CONN_ID!r} and no SERVETUNE_DATABASE_URL")
    from servetune.warehouse.db import resolve_url

    return resolve_url(uri)
