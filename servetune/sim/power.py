"""The simulator's power model: what a modelled GPU draws while its batches run.

A forward pass over few tokens is memory-bound: HBM streams the weights at full speed while the tensor
cores mostly wait, and the board draws well under its limit. As the tokens per pass approach the
compute/memory balance point (the GPU's FLOP/s over its bytes/s: at bf16, two bytes and two FLOPs per
weight per token), the tensor cores fill and the draw approaches the limit. So a pass draws
``idle + (tdp - idle) x activity``, activity = floor + (1 - floor) x min(1, tokens / balance), and an idle
interval draws ``idle``. The floor is the share of the dynamic range a memory-bound pass draws (about half
on H100-class boards). Modelled, never a measurement: trials say so (servetune.energy, ``modelled``).
"""

from __future__ import annotations

from .profiles import GpuProfile
from .requests import Iteration

MEMORY_BOUND_SHARE = 0.55


def balance_tokens(gpu: GpuProfile) -> float:
    """Tokens per pass at which compute time equals weight-streaming time."""
    return gpu.flops_per_s / gpu.bytes_per_s


def activity(gpu: GpuProfile, it: Iteration) -> float:
    """The share of the board's dynamic power one pass draws while it runs."""
    tokens = it.new_tokens if it.kind == "prefill" else it.batch_size
    return MEMORY_BOUND_SHARE + (1.0 - MEMORY_BOUND_SHARE) * min(1.0, tokens / balance_tokens(gpu))


def watts(gpu: GpuProfile, active_share: float) -> float:
    """The draw over an interval whose passes were active ``active_share`` of it (busy x activity)."""
    return gpu.idle_w + (gpu.tdp_w - gpu.idle_w) * min(1.0, max(0.0, active_share))
