"""When servetune_weekly runs: Mondays 04:00 UTC by default, the team's GPU window where
``SERVETUNE_WEEKLY_CRON`` names one, no schedule at all with ``off`` (the DAG file parsed by Airflow's own DagBag)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

DAG_FILE = Path(__file__).resolve().parent.parent / "servetune_airflow" / "dags" / "servetune_weekly.py"
SHOW = ("import sys; from airflow.dag_processing.dagbag import DagBag; "
        "t = DagBag(dag_folder=sys.argv[1]).dags['servetune_weekly'].timetable; "
        "print(type(t).__name__, getattr(t, 'expression', None), getattr(t, 'run_immediately', None))")


@pytest.mark.parametrize(("cron", "expected"), [
    (None, "CronTriggerTimetable 0 4 * * 1 False"),
    ("0 22 * * 5", "CronTriggerTimetable 0 22 * * 5 False"),
    ("off", "NullTimetable None None"),
])
def test_the_weekly_schedule_follows_servetune_weekly_cron(tmp_path, cron, expected) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SERVETUNE_WEEKLY_CRON"}
    env.update(AIRFLOW_HOME=str(tmp_path), **({"SERVETUNE_WEEKLY_CRON": cron} if cron is not None else {}))
    out = subprocess.run([sys.executable, "-c", SHOW, str(DAG_FILE)], env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == expected
