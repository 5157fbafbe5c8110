"""A real-time campaign over HTTP: LiveTrialRunner against `servetune sim serve` processes.

Servers are started by servetune.runners.provision (the sim engine on the local runner), and every
server-side change restarts one; every trial is a real servetune.trial.run_trial over loopback HTTP. The demo plan
is sized to finish in well under three minutes on a 2-core machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench_modules import bench_module
from servetune.plan import load_plan
from servetune.report.campaign import load_result_dir
from servetune.report.cost import answer_cost
from servetune.result import TrialResult
from servetune.tuning.campaign import Campaign
from servetune.tuning.live import LiveTrialRunner, engine_provisioner
from servetune.tuning.state import Flags

REPO = Path(__file__).resolve().parent.parent


demo_plan = bench_module("busy_host").demo_plan  # the live campaign bench/busy_host.py runs on a busy host too


class Recording:
    """servetune.runners.provision through the plan's engine and runner, remembering every server started."""

    def __init__(self, plan, log_dir: Path) -> None:
        self.inner = engine_provisioner(plan, log_dir=log_dir)
        self.pids: list[int] = []
        self.flags: list[Flags] = []

    @contextlib.contextmanager
    def __call__(self, flags: Flags) -> Iterator[object]:
        with self.inner(flags) as server:
            self.pids.append(server.pid)
            self.flags.append(dict(flags))
            yield server


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.timeout(900)  # ~160 s idle, ~230 s beside a busy job on a 2-core box
def test_demo_campaign_over_http_in_real_time(tmp_path: Path) -> None:
    plan = demo_plan()  # one refinement flag, trials capped at 240 requests, no bisection
    procs = Recording(plan, tmp_path / "logs")
    t0 = time.monotonic()
    campaign = Campaign(plan, LiveTrialRunner(plan, provisioner=procs), tmp_path / "out")
    decision = campaign.run()
    elapsed = time.monotonic() - t0

    assert decision.done and not decision.failed, decision.reason
    exp = json.loads((tmp_path / "out" / "experiment.json").read_text())
    rec = json.loads((tmp_path / "out" / "recommendation.json").read_text())
    assert exp["status"] == "done" and exp["recommendation"] == rec
    trials = [TrialResult.read(p) for p in (tmp_path / "out" / "trials").glob("*.json")]
    ordered = sorted(trials, key=lambda t: t.created_at)
    assert len(trials) == len(campaign.state.outcomes)
    assert all(t.status == "ok" for t in trials), [t.failure_reason for t in trials if t.status != "ok"]
    # real time: one after another, the trials' measured windows fit inside the campaign's own wall time
    windows = sum(t.summary.window_s or 0.0 for t in trials)
    assert 0 < windows <= elapsed, (windows, elapsed)
    assert all(t.target["url"].startswith("http://127.0.0.1:") for t in trials)
    # measured over HTTP: real records with SSE timings, server telemetry from /metrics
    chosen = next(t for t in trials if t.trial_id == rec["evidence_trial_ids"][0])
    assert chosen.summary.requests_measured == chosen.load["requests"] and chosen.records
    assert chosen.summary.server_samples > 0 and chosen.summary.prefix_hit_rate is not None
    assert rec["concurrency"] >= plan.stages.baseline.concurrency

    # every server-side change restarted a real process, and none is left running
    stages = {t.stage for t in trials}
    assert {"correctness", "baseline", "ramp", "refine"} <= stages
    distinct_configs = {json.dumps(t.server_config, sort_keys=True) for t in trials}
    assert len(procs.pids) >= len(distinct_configs) > 1
    changes = 1 + sum(a.server_config != b.server_config
                      for a, b in zip(ordered, ordered[1:], strict=False))
    assert len(procs.pids) == changes  # one server per run of equal flags, restarted on every change
    assert all(gone(pid) for pid in procs.pids)
    # where each start went, read from the engine's own log (the simulator logs SGLang's start lines): on the
    # trial that started the server only, and the report says where the first one went
    starts = [t.server["startup"] for t in ordered if (t.server or {}).get("startup")]
    assert len(starts) == len(procs.pids) and all(s["cuda_graphs_s"] > s["weights_s"] > 0 for s in starts), starts
    cost = answer_cost(load_result_dir(tmp_path / "out"))
    assert cost is not None and "the first start, by the engine's log: " in cost.text(), cost


def test_a_server_that_dies_at_start_is_a_failed_trial(tmp_path: Path) -> None:
    """The simulator refuses a KV pool that does not fit (weights > mem-fraction-static x GPU) at start-up."""
    plan = load_plan(REPO / "plans" / "demo.yaml")
    engine = plan.engine.model_copy(update={"args": {"mem-fraction-static": 0.05}})
    plan = plan.model_copy(update={"engine": engine})
    decision = Campaign(plan, LiveTrialRunner(plan, log_dir=tmp_path / "logs"), tmp_path / "out").run()
    assert decision.failed and "server failed to start" in decision.reason
    (only,) = [TrialResult.read(p) for p in (tmp_path / "out" / "trials").glob("*.json")]
    assert only.stage == "correctness" and only.status == "failed"
    assert "server failed to start" in (only.failure_reason or "")
    assert json.loads((tmp_path / "out" / "experiment.json").read_text())["status"] == "failed"
