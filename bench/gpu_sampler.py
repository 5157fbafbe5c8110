"""GpuSampler cadence and cost on a real GPU: how close the ticks stay to the grid, how long one
NVML sweep takes, and the CPU the sampling thread costs (against an idle baseline of the same length).

Usage: python bench/gpu_sampler.py [--seconds 5] [--interval 0.1 0.02 0.01]
Imports only servetune.telemetry.nvml (runs under a bare GPU image's python3).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servetune.telemetry.nvml import GpuSampler


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--interval", type=float, nargs="+", default=[0.1, 0.02, 0.01])
    a = ap.parse_args()

    cpu0 = time.process_time()
    time.sleep(a.seconds)
    idle_cpu = time.process_time() - cpu0
    print(f"idle baseline: {idle_cpu * 1000:.1f} ms CPU over {a.seconds:.0f} s")

    for interval in a.interval:
        t0 = time.perf_counter_ns()
        cpu0 = time.process_time()
        sampler = GpuSampler(interval_s=interval).start(t0)
        time.sleep(a.seconds)
        out = sampler.stop()
        cpu = time.process_time() - cpu0
        if out["state"] != "ok":
            print(f"state={out['state']}: {out['reason']}")
            return
        gpus = [d["index"] for d in out["devices"]]
        first = [s["t_s"] for s in out["samples"] if s["gpu"] == gpus[0]][:-1]  # final reading is off-grid
        grid_err_ms = [abs(t - first[0] - k * interval) * 1000 for k, t in enumerate(first)]
        gaps_ms = [(b - a_) * 1000 for a_, b in itertools.pairwise(first)]
        print(
            f"interval {interval * 1000:.0f} ms, {len(gpus)} GPU ({out['devices'][0]['name']}): "
            f"{len(first)} ticks, missed {out['missed_ticks']}, gap mean {statistics.mean(gaps_ms):.3f} ms "
            f"p99 {_pct(gaps_ms, 0.99):.3f} ms, grid error p50 {_pct(grid_err_ms, 0.5):.3f} ms "
            f"p99 {_pct(grid_err_ms, 0.99):.3f} ms max {max(grid_err_ms):.3f} ms, "
            f"CPU {cpu * 1000:.0f} ms = {cpu / a.seconds * 100:.2f}% of a core, "
            f"{cpu * 1000 / len(out['samples']):.3f} ms per reading "
            f"(idle baseline x{cpu / max(idle_cpu, 1e-6):.0f})"
        )


if __name__ == "__main__":
    main()
