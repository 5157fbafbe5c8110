"""An engine crash is a fault, never a capacity verdict: the trial is recorded with the crash, the engine is
started again and the trial re-run (bounded); a level where the engine keeps dying is a fault, said so.

The decisions on hand-made outcomes, then a real campaign whose simulated engine process is killed
(SIGKILL of its process group) in the middle of a ramp trial."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from airflow_fixtures import TINY_PLAN
from servetune.plan import parse_plan
from servetune.result import TrialResult
from servetune.tuning import CampaignState, TrialOutcome, next_trials
from servetune.tuning.campaign import Campaign
from servetune.tuning.live import LiveTrialRunner
from servetune.tuning.state import ENGINE_CRASH
from test_tuning_decisions import make_plan, summary
from test_tuning_live import gone


def crash(i: int, spec) -> TrialOutcome:
    return TrialOutcome(trial_id=f"t{i}", stage=spec.stage, concurrency=spec.concurrency, flags=spec.flags,
                        requests=spec.requests, warmup=spec.warmup, status="failed",
                        failure_reason=f"{ENGINE_CRASH}: died: sglang exited with code -9 while serving",
                        seed_offset=spec.seed_offset, gpu_seconds=30)


def drive(plan, crashes_at: dict[int, int]):
    """Answer trials from a healthy surface, except that the engine dies under the first N trials at a level."""
    state, asked = CampaignState(), []
    for i in range(100):
        d = next_trials(plan, state)
        if d.done:
            return d, asked, state
        (spec,) = d.trials
        asked.append(spec)
        if crashes_at.get(spec.concurrency, 0) > 0:
            crashes_at[spec.concurrency] -= 1
            state = state.add(crash(i, spec))
            continue
        s = summary(thr=spec.concurrency * 0.1, mem=0.95 if spec.concurrency >= 64 else 0.5)
        state = state.add(TrialOutcome(trial_id=f"t{i}", stage=spec.stage, concurrency=spec.concurrency,
                                       flags=spec.flags, requests=spec.requests, warmup=spec.warmup, summary=s,
                                       seed_offset=spec.seed_offset, gpu_seconds=60))
    raise AssertionError("campaign did not finish")


def test_a_crash_is_rerun_and_the_answer_is_the_healthy_one() -> None:
    plan = make_plan(repeats={"count": 1})
    healthy, _, _ = drive(plan, {})
    d, asked, state = drive(plan, {32: 2})  # the engine dies twice at 32, then serves
    assert sum(t.concurrency == 32 for t in asked) == 3
    assert "re-run after an engine crash" in [t for t in asked if t.concurrency == 32][1].reason
    assert d.ceiling is not None and healthy.ceiling is not None
    assert (d.ceiling.level, d.ceiling.kind) == (healthy.ceiling.level, healthy.ceiling.kind) == (32, "memory")
    assert d.recommendation is not None and d.recommendation.concurrency == healthy.recommendation.concurrency
    assert any("the engine died under 2 trial(s)" in line for line in d.recommendation.explanation)
    assert len(state.outcomes) == len(healthy_outcomes := drive(plan, {})[2].outcomes) + 2, healthy_outcomes


def test_a_level_where_the_engine_keeps_dying_is_a_fault_not_a_ceiling_verdict() -> None:
    plan = make_plan(repeats={"count": 1, "crash_retries": 2})
    d, asked, _ = drive(plan, {32: 99})
    assert sum(t.concurrency == 32 for t in asked) == 3  # the first try and two re-runs
    assert d.ceiling is not None and d.ceiling.kind == "fault" and d.ceiling.level == 16
    assert "not a capacity verdict" in d.ceiling.reasons[0]
    plan_stop = make_plan(repeats={"count": 1}, on_trial_failure="stop")
    d, _, _ = drive(plan_stop, {32: 1})  # a crash is re-run even when failures stop the campaign
    assert not d.failed and d.ceiling is not None and d.ceiling.level == 32


class KillingRunner(LiveTrialRunner):
    """Kills the engine's process group 0.5 s into the first trial at ``level``."""

    def __init__(self, plan, level: int, **kw) -> None:
        super().__init__(plan, **kw)
        self.level = level
        self.killed: list[int] = []

    def run(self, spec, *, experiment_id):
        if spec.concurrency == self.level and not self.killed and self._server is not None:
            pid = self._server.pid
            self.killed.append(pid)
            threading.Timer(0.5, lambda: os.killpg(pid, signal.SIGKILL)).start()
        return super().run(spec, experiment_id=experiment_id)


@pytest.mark.timeout(300)
def test_an_engine_killed_mid_ramp_is_restarted_and_the_trial_rerun(tmp_path: Path) -> None:
    plan = parse_plan({**TINY_PLAN, "stages": {**TINY_PLAN["stages"], "refine": {"enabled": False}}})
    runner = KillingRunner(plan, 4, log_dir=tmp_path / "logs")
    decision = Campaign(plan, runner, tmp_path / "out").run()
    trials = sorted((TrialResult.read(p) for p in (tmp_path / "out" / "trials").glob("*.json")),
                    key=lambda t: t.created_at)
    crashed = [t for t in trials if (t.failure_reason or "").startswith(ENGINE_CRASH)]
    assert len(crashed) == 1 and crashed[0].load["concurrency"] == 4, [t.failure_reason for t in trials]
    assert "exited" in crashed[0].failure_reason  # the engine's exit, with its log tail
    rerun = [t for t in trials if t.load["concurrency"] == 4 and t.status == "ok"]
    assert rerun and rerun[0].created_at > crashed[0].created_at
    assert decision.done and not decision.failed, decision.reason
    assert decision.ceiling is not None and decision.ceiling.kind != "fault" and decision.ceiling.level >= 4
    assert runner.killed and gone(runner.killed[0])
    assert len(list((tmp_path / "logs").glob("sim-*.log"))) >= 2  # a second engine was started
