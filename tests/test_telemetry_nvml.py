"""GpuSampler on a real GPU (skipped where NVML is absent; run on a GPU machine).

Imports nothing but servetune.telemetry.nvml, so it also runs under a bare GPU image's python
with ``pytest --noconftest``.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time

import pytest

from servetune.telemetry.nvml import GpuSampler, GpuUnavailable, gpu_memory_used, gpu_processes


def _nvml_ok() -> bool:
    try:
        gpu_memory_used()
    except GpuUnavailable:
        return False
    return True


pytestmark = pytest.mark.skipif(not _nvml_ok(), reason="no NVML / GPU here")


def test_sampler_keeps_its_cadence_and_describes_the_gpus():
    t0 = time.perf_counter_ns()
    sampler = GpuSampler(interval_s=0.05).start(t0)
    time.sleep(1.0)
    out = sampler.stop()
    assert out["state"] == "ok", out["reason"]
    n_gpus = len(out["devices"])
    assert n_gpus >= 1
    d = out["devices"][0]
    assert d["name"] and d["uuid"].startswith(("GPU-", "MIG-")) and d["mem_total"] > 0 and d["driver"]
    per_gpu = [s for s in out["samples"] if s["gpu"] == d["index"]]
    # 1 s at 50 ms: 20 ticks + the start and the final reading, minus what a loaded host skipped
    assert 15 <= len(per_gpu) + out["missed_ticks"] <= 23, (len(per_gpu), out["missed_ticks"])
    ts = [s["t_s"] for s in per_gpu]
    assert ts == sorted(ts) and 0 <= ts[0] < 0.2 and ts[-1] >= 0.95
    gaps = [b - a for a, b in itertools.pairwise(ts[:-1])]  # the final reading is off-grid
    assert abs(sum(gaps) / len(gaps) - 0.05) < 0.01
    s = per_gpu[0]
    assert 0 < s["mem_used"] <= s["mem_total"] == d["mem_total"]
    assert s["util"] is None or 0 <= s["util"] <= 100
    assert s["power_w"] is None or 10 < s["power_w"] < 2000


def test_processes_and_memory_of_a_process_holding_the_gpu():
    torch_code = (
        "import sys, torch; x = torch.empty(4 << 30, dtype=torch.uint8, device='cuda'); x.fill_(1); "
        "torch.cuda.synchronize(); print('ready', flush=True); sys.stdin.read()"
    )
    try:
        import torch  # noqa: F401
    except ImportError:
        pytest.skip("torch is needed to hold GPU memory")
    before = gpu_memory_used([0])[0]
    sampler = GpuSampler(interval_s=0.05, gpu_indices=[0]).start()
    proc = subprocess.Popen(
        [sys.executable, "-c", torch_code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        held = gpu_memory_used([0])[0]
        assert held - before >= 4 << 30
        procs = gpu_processes([0], own_pids=[os.getpid()])
        mine = [p for p in procs if p["pid"] == proc.pid]
        print("processes seen by NVML:", procs)
        if mine:  # NVML may not report PIDs of this namespace (containers, VMs)
            assert mine[0]["gpu"] == 0 and mine[0]["name"] and mine[0]["name"].startswith("python")
            assert mine[0]["foreign"] is False  # a child of this test process
            assert mine[0]["used_memory"] is None or mine[0]["used_memory"] >= 4 << 30
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    out = sampler.stop()
    peak = max(s["mem_used"] for s in out["samples"])
    assert peak - before >= 4 << 30  # the curve saw the allocation
    assert out["samples"][-1]["mem_used"] < peak  # and its release
