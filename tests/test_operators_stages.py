"""The DAG's stage tasks run in order, and a later stage can re-open an earlier one's measurement (a re-run
that grows a level's trial size makes the ramp's trials there stale): each task runs its own decision stages
and every earlier one, so the campaign never ends "incomplete" with its earlier tasks already done."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import get_args

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from servetune.tuning.state import Stage  # noqa: E402
from servetune_airflow.tasks import STAGES  # noqa: E402


def test_each_stage_task_runs_its_stages_and_every_earlier_one() -> None:
    tasks = list(STAGES)
    assert tasks == ["correctness", "baseline", "ramp", "refine"]
    for before, after in zip(tasks, tasks[1:], strict=False):
        assert set(STAGES[before]) < set(STAGES[after])  # a later task also runs what an earlier one ran
    assert STAGES["ramp"][-2:] == ("ramp", "bisect") and "refine" not in STAGES["ramp"]
    # the last task can run any decision stage but the protocols (their own task, before the stages)
    assert set(STAGES["refine"]) == set(get_args(Stage)) - {"protocol"}


def test_a_stage_task_waits_for_a_live_attempt_and_stops_a_dead_ones_engine(tmp_path) -> None:
    """A retried stage task holds the campaign folder alone (servetune.campaign_lock); holding it, any engine
    tagged with the experiment is a dead attempt's, and is stopped before a trial starts."""
    import os
    import subprocess

    from servetune.runners.sweep import OWNER_ENV
    from servetune_airflow import tasks

    exp = {"experiment_id": "exp-" + os.urandom(4).hex(), "out_dir": str(tmp_path)}
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              env={**os.environ, OWNER_ENV: exp["experiment_id"]}, start_new_session=True)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with tasks._sole_runner(exp):
            assert engine.wait(timeout=15) is not None  # stopped: no other attempt could be using it
            assert bystander.poll() is None
    finally:
        for p in (engine, bystander):
            p.kill()
            p.wait()
