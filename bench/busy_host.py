"""A live campaign on a host kept busy: does it still measure, or fail in one line that names the cause?

The demo plan (`plans/demo.yaml`, one refinement flag, trials capped at 240 requests, no bisection: the live test's
campaign, tests/test_tuning_live.py) runs in real time against `servetune sim serve` processes, first on the idle
host, then with ``--busy`` CPU-bound processes on every core (``stress-ng --cpu N`` where installed, else Python
busy loops at the same nice level as the campaign). For each run it prints the trials, how many the checklist
accepted, the items that rejected the others, the client's lag and the GPU sampler's cadence (the simulated
engine's memory curve, sampled as a real one is), and the campaign's last line: a recommendation, or the reason
there is none.

Usage:
  .venv/bin/python bench/busy_host.py                 # idle, then busy with one loop per core
  .venv/bin/python bench/busy_host.py --busy 4 --skip-idle
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from servetune.checklist_report import items_in  # noqa: E402
from servetune.plan import load_plan  # noqa: E402
from servetune.tuning.campaign import Campaign  # noqa: E402
from servetune.tuning.live import LiveTrialRunner  # noqa: E402

SPIN = "import time\nwhile True:\n    time.perf_counter()\n"


def demo_plan():
    """The live test's campaign (tests/test_tuning_live.py): a few minutes of real time on an idle 2-core host.
    One refinement flag, trials capped at 240 requests (an unsettled p99 at the edge would be re-measured at 1,000+,
    a minute each in real time) and no bisection: the virtual and rate-mode campaigns walk those; here the ramp's
    verdicts and the restarts over real HTTP are what is checked."""
    plan = load_plan(ROOT / "plans" / "demo.yaml")
    refine = plan.stages.refine.model_copy(update={"grid": {"chunked-prefill-size": [1024]}, "set_max_running": False})
    stages = plan.stages.model_copy(update={"refine": refine,
                                            "ramp": plan.stages.ramp.model_copy(update={"bisect": False})})
    budget = plan.budget.model_copy(update={"max_requests_per_trial": 240})
    return plan.model_copy(update={"stages": stages, "budget": budget})


def start_load(n: int) -> tuple[list[subprocess.Popen], str]:
    if n <= 0:
        return [], "idle"
    if shutil.which("stress-ng"):
        return [subprocess.Popen(["stress-ng", "--cpu", str(n), "--quiet"])], f"stress-ng --cpu {n}"
    return [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(n)], f"{n} Python busy loop(s)"


def run(busy: int) -> dict:
    procs, what = start_load(busy)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            plan = demo_plan()
            t0 = time.monotonic()
            campaign = Campaign(plan, LiveTrialRunner(plan), Path(tmp) / "out")
            decision = campaign.run()
            wall = time.monotonic() - t0
            outcomes = campaign.state.outcomes
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
    measured = [o for o in outcomes if o.stage != "correctness"]
    items = Counter(i for o in measured if o.rejected for i in items_in(o.failure_reason))
    lags = [o.summary.client_lag_p99_ms for o in measured if o.summary.client_lag_p99_ms is not None]
    intervals = [sample_interval_ms(o.summary) for o in measured]
    rec = decision.recommendation
    last = (f"recommendation: concurrency {rec.concurrency}, goodput {rec.goodput_rps:.2f} req/s" if rec
            else f"no recommendation: {decision.reason}")
    return {"load": what, "wall_s": wall, "trials": len(measured), "accepted": sum(not o.rejected for o in measured),
            "rejected_by": dict(items), "lag_p99_ms_max": max(lags, default=None),
            "interval_ms_max": max((g for g in intervals if g is not None), default=None), "last": last}


def sample_interval_ms(s) -> float | None:
    """The window's length over its GPU samples: the sampler's mean interval, against its 100 ms cadence."""
    if not s.gpu_samples or not s.window_s:
        return None
    return 1000.0 * s.window_s / s.gpu_samples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--busy", type=int, default=os.cpu_count() or 2, help="CPU-bound processes (default: one per core)")
    ap.add_argument("--skip-idle", action="store_true", help="only the busy run")
    args = ap.parse_args()
    rows = ([] if args.skip_idle else [run(0)]) + [run(args.busy)]
    print(f"host: {os.cpu_count()} cores; plan: demo (live, sim engine over HTTP)")
    print("| load | wall s | trials | accepted | rejected by (trials) | client lag p99 max ms | window / GPU samples"
          " ms (max) | the campaign's last line |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        rej = ", ".join(f"{k} {v}" for k, v in r["rejected_by"].items()) or "-"
        lag = f"{r['lag_p99_ms_max']:.1f}" if r["lag_p99_ms_max"] is not None else "-"
        gap = f"{r['interval_ms_max']:.0f}" if r["interval_ms_max"] is not None else "-"
        print(f"| {r['load']} | {r['wall_s']:.0f} | {r['trials']} | {r['accepted']} | {rej} | {lag} | {gap} |"
              f" {r['last']} |")


if __name__ == "__main__":
    main()
