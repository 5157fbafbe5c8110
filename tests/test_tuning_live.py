"""A real-time campaign over HTTP: LiveTrialRunner against `servetune sim serve` processes.

Every server-side change restarts a real server process; every trial is a real
servetune.trial.run_trial over loopback HTTP. The demo plan is sized to finish in well under
three minutes on a 2-core machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from servetune.plan import load_plan
from servetune.result import TrialResult
from servetune.tuning.campaign import Campaign
from servetune.tuning.live import LiveTrialRunner
from servetune.tuning.state import Flags

REPO = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def flags_to_argv(flags: Flags) -> list[str]:
    argv: list[str] = []
    for k, v in flags.items():
        argv.append(f"--{k}")
        if v is not None and v is not True:
            argv.append(str(v))
    return argv


@dataclass
class Started:
    url: str
    pid: int


class SimProcesses:
    """Starts `servetune sim serve` with a trial's flags; remembers every process to prove teardown."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    @contextlib.contextmanager
    def __call__(self, flags: Flags) -> Iterator[Started]:
        port = _free_port()
        cmd = [sys.executable, "-m", "servetune", "sim", "serve", "--port", str(port), "--load-seconds", "0.2",
               *flags_to_argv(flags)]
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"sim server exited {proc.returncode}: {proc.stderr.read()[-500:]}")
                try:
                    with urllib.request.urlopen(url + "/health_generate", timeout=5) as r:
                        if r.status == 200:
                            break
                except (urllib.error.URLError, OSError):
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("sim server never became ready")
                time.sleep(0.05)
            yield Started(url=url, pid=proc.pid)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.mark.timeout(240)
def test_demo_campaign_over_http_in_real_time(tmp_path: Path) -> None:
    plan = load_plan(REPO / "plans" / "demo.yaml")
    procs = SimProcesses()
    t0 = time.monotonic()
    campaign = Campaign(plan, LiveTrialRunner(plan, provisioner=procs), tmp_path)
    decision = campaign.run()
    elapsed = time.monotonic() - t0
    assert elapsed < 180, f"the demo took {elapsed:.0f} s"

    assert decision.done and not decision.failed, decision.reason
    exp = json.loads((tmp_path / "experiment.json").read_text())
    rec = json.loads((tmp_path / "recommendation.json").read_text())
    assert exp["status"] == "done" and exp["recommendation"] == rec
    trials = [TrialResult.read(p) for p in (tmp_path / "trials").glob("*.json")]
    assert len(trials) == len(campaign.state.outcomes)
    assert all(t.status == "ok" for t in trials), [t.failure_reason for t in trials if t.status != "ok"]
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
    assert len(procs.procs) >= len(distinct_configs) > 1
    assert all(p.poll() is not None for p in procs.procs)


def test_a_server_that_refuses_its_flags_is_a_failed_trial(tmp_path: Path) -> None:
    plan = load_plan(REPO / "plans" / "demo.yaml")
    plan = plan.model_copy(update={"engine": plan.engine.model_copy(update={"flags": {"schedule-policy": "nope"}})})
    procs = SimProcesses()
    decision = Campaign(plan, LiveTrialRunner(plan, provisioner=procs), tmp_path).run()
    assert decision.failed and "server failed to start" in decision.reason
    (only,) = [TrialResult.read(p) for p in (tmp_path / "trials").glob("*.json")]
    assert only.stage == "correctness" and only.status == "failed" and "invalid choice" in only.failure_reason
    assert json.loads((tmp_path / "experiment.json").read_text())["status"] == "failed"
    assert all(p.poll() is not None for p in procs.procs)
