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
    (None, "CronTriggerTimetable 0 4 * * 1 0:00:00"),
    ("0 22 * * 5", "CronTriggerTimetable 0 22 * * 5 0:00:00"),
    ("off", "NullTimetable None None"),
])
def test_the_weekly_schedule_follows_servetune_weekly_cron(tmp_path, cron, expected) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SERVETUNE_WEEKLY_CRON"}
    env.update(AIRFLOW_HOME=str(tmp_path), **({"SERVETUNE_WEEKLY_CRON": cron} if cron is not None else {}))
    out = subprocess.run([sys.executable, "-c", SHOW, str(DAG_FILE)], env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == expected


FIRST = ("import sys; from datetime import datetime, timezone; from airflow.dag_processing.dagbag import DagBag; "
         "from airflow.serialization.serialized_objects import DagSerialization as S; "
         "from airflow.timetables.base import TimeRestriction; "
         "dag = S.from_dict(S.to_dict(DagBag(dag_folder=sys.argv[1]).dags['servetune_weekly'])); "
         "now = datetime.now(timezone.utc); "
         "info = dag.timetable.next_dagrun_info(last_automated_data_interval=None, "
         "restriction=TimeRestriction(earliest=None, latest=None, catchup=False)); "
         "print('next' if info.run_after > now else 'past', info.run_after.isoformat(), now.isoformat())")


def test_a_newly_unpaused_dag_waits_for_its_next_tick(tmp_path) -> None:
    """The scheduler's own (deserialized) timetable: the first run is the next tick, never the last one. Airflow
    3.3.2 reads run_immediately=False like None, so a DAG first parsed less than a tenth of its interval after a
    tick ran that tick at once when unpaused (16.8 h for a weekly cron; seen: unpaused Monday 04:55, the 04:00
    run started). An every-minute cron shows it every time: under False the answer is the minute just past."""
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "SERVETUNE_WEEKLY_CRON": "* * * * *"}
    out = subprocess.run([sys.executable, "-c", FIRST, str(DAG_FILE)], env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1].startswith("next "), out.stdout
