"""The GPU sampler's readings as a trial summary's GPU figures, and the one rule for a GPU clean at the start."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from servetune.result import TrialSummary


def gpu_sweeps(samples: Sequence[dict[str, Any]]) -> list[dict[int, dict[str, Any]]]:
    """Group per-GPU samples into sweeps (one reading of every GPU): a repeated GPU index starts a new one."""
    sweeps: list[dict[int, dict[str, Any]]] = []
    cur: dict[int, dict[str, Any]] = {}
    for sample in samples:
        g = int(sample.get("gpu", 0))
        if g in cur:
            sweeps.append(cur)
            cur = {}
        cur[g] = sample
    if cur:
        sweeps.append(cur)
    return sweeps


def summarize_gpu(s: TrialSummary, gpu: dict[str, Any] | None) -> None:
    """The sampler's readings (every GPU about every 100 ms) as the summary's GPU figures: memory peak, mean,
    idle and total, utilisation, power, and whether the GPU was clean at the start."""
    if not gpu:
        return
    s.gpu_state = str(gpu.get("state") or "unknown")
    interval = gpu.get("interval_ms")
    s.gpu_sample_interval_ms = float(interval) if interval is not None else None
    s.gpu_clean_at_start = clean_at_start(gpu)
    sweeps = gpu_sweeps(gpu.get("samples") or [])
    s.gpu_samples = len(sweeps)
    if not sweeps:
        return
    used = [sum(int(x["mem_used"]) for x in sw.values()) for sw in sweeps]
    totals: dict[int, int] = {}
    for sw in sweeps:
        for g, x in sw.items():
            totals[g] = max(totals.get(g, 0), int(x["mem_total"]))
    s.gpu_mem_peak_bytes = max(used)
    s.gpu_mem_mean_bytes = float(np.mean(used))
    s.gpu_mem_idle_bytes = used[0]
    s.gpu_mem_total_bytes = sum(totals.values())
    if s.gpu_mem_total_bytes:
        s.gpu_mem_peak_fraction = s.gpu_mem_peak_bytes / s.gpu_mem_total_bytes
    utils = [float(x["util"]) for sw in sweeps for x in sw.values() if x.get("util") is not None]
    if utils:
        s.gpu_util_mean = float(np.mean(utils))
    power = [
        sum(float(x["power_w"]) for x in sw.values())
        for sw in sweeps
        if all(x.get("power_w") is not None for x in sw.values())
    ]
    if power:
        s.gpu_power_mean_w = float(np.mean(power))


def clean_at_start(gpu: dict[str, Any]) -> bool | None:
    """THE clean-GPU-at-start rule (the checklist's ``clean_gpu``; the stored-trial SQL mirrors it): no foreign
    process held a sampled (or simulated) GPU; None when that cannot be told: no GPU state, no process
    list, or an entry without the sampler's ``foreign`` mark (the server's PIDs were unknown)."""
    procs = gpu.get("processes_at_start")
    if gpu.get("state") not in ("ok", "simulated") or not isinstance(procs, list):
        return None
    if any(isinstance(p, dict) and p.get("foreign") is True for p in procs):
        return False
    return True if all(isinstance(p, dict) and p.get("foreign") is False for p in procs) else None
