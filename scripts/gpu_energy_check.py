"""On a real GPU: does NVML's total-energy counter agree with the integrated power curve, as servetune reads both?

Runs servetune's own GpuSampler (100 ms) over idle, a small and a large bf16 matrix-product phase, then takes
each phase's energy with servetune.energy.window_energy (the counter, the curve, their ratio) and the
products' FLOPs per joule. Writes the samples and the phases to OUT/energy.json, which tests replay
(tests/test_gpu_energy_h100.py). Usage: python scripts/gpu_energy_check.py OUT_DIR [phase seconds]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from servetune.energy import window_energy
from servetune.telemetry.nvml import GpuSampler

EDGE_S = 0.5  # the start and end of a phase are left out: the board ramps its clocks


def burn(n: int, seconds: float, t0_ns: int) -> dict:
    """Matrix products of n x n bf16 for ``seconds``: the phase's bounds and its FLOPs."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    start, count = time.perf_counter_ns(), 0
    while time.perf_counter_ns() - start < seconds * 1e9:
        for _ in range(20):
            a @ b
        count += 20
        torch.cuda.synchronize()
    end = time.perf_counter_ns()
    return {"n": n, "start_s": (start - t0_ns) / 1e9, "end_s": (end - t0_ns) / 1e9, "flops": 2.0 * n**3 * count}


def idle(seconds: float, t0_ns: int) -> dict:
    start = time.perf_counter_ns()
    time.sleep(seconds)
    return {"n": 0, "start_s": (start - t0_ns) / 1e9, "end_s": (time.perf_counter_ns() - t0_ns) / 1e9, "flops": 0.0}


def main(out: Path, seconds: float) -> None:
    t0 = time.perf_counter_ns()
    sampler = GpuSampler(0.1, [0]).start(t0)
    phases = [idle(3.0, t0), burn(1024, seconds, t0), burn(8192, seconds, t0), idle(3.0, t0)]
    gpu = sampler.stop()
    print(f"device: {gpu['devices'][0]['name']}, limit {gpu['devices'][0].get('power_limit_w')} W,"
          f" {len(gpu['samples'])} samples, state {gpu['state']}")
    for p in phases:
        e = window_energy(gpu, p["start_s"] + EDGE_S, p["end_s"] - EDGE_S)
        p["energy"] = e
        if e is None:
            print(f"n={p['n']}: no energy over the phase")
            continue
        g = e["gpus"][0]
        per_j = p["flops"] / (p["end_s"] - p["start_s"]) / e["mean_w"] if p["flops"] else 0.0
        print(f"n={p['n']:5d}: {e['method']}: counter {g['joules_counter']:.1f} J, curve {g['joules_curve']:.1f} J,"
              f" curve/counter {e['curve_over_counter']:.4f}, mean {e['mean_w']:.1f} W, peak {e['peak_w']:.1f} W,"
              f" {per_j / 1e9:.1f} GFLOP/J")
    out.mkdir(parents=True, exist_ok=True)
    (out / "energy.json").write_text(json.dumps({"gpu": gpu, "phases": phases, "edge_s": EDGE_S}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 10.0)
