"""The DAG's stage tasks run in order, and a later stage can re-open an earlier one's measurement (a re-run
that grows a level's trial size makes the ramp's trials there stale): each task runs its own decision stages
and every earlier one, so the campaign never ends "incomplete" with its earlier tasks already done."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import get_args

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from servetune_airflow.tasks import STAGES  # noqa: E402
from servetune.tuning.state import Stage  # noqa: E402


def test_each_stage_task_runs_its_stages_and_every_earlier_one() -> None:
    tasks = list(STAGES)
    assert tasks == ["correctness", "baseline", "ramp", "refine"]
    for before, after in zip(tasks, tasks[1:], strict=False):
        assert set(STAGES[before]) < set(STAGES[after])  # a later task also runs what an earlier one ran
    assert STAGES["ramp"][-2:] == ("ramp", "bisect") and "refine" not in STAGES["ramp"]
    # the last task can run any decision stage but the protocols (their own task, before the stages)
    assert set(STAGES["refine"]) == set(get_args(Stage)) - {"protocol"}
