"""Rule 1: the GPU memory curve's shape, on NVML curves and on the simulator's alike.

Four shapes, each with its cause and its flag (docs/diagnoses.md):
sawtooth (prefill activations come and go: ``--chunked-prefill-size``), a smooth rise to the limit
(memory grows with the tokens held: KV accumulation; ``--max-running-requests`` or more reserve),
a plateau at the pool's level (SGLang preallocates weights + KV pool at start: normal pooling), and an
early out-of-memory below the level expected (fragmentation, or a reserve too small for activations).
The curve is the per-sweep sum over the sampled GPUs (as ``servetune.metrics``); its first
``SETTLE_FRACTION`` is left out of the shape tests, so an engine's start-up allocation is no "rise".
"""

from __future__ import annotations

from typing import Any

import numpy as np

from servetune.diagnose import Finding, flag, r3
from servetune.result import TrialResult

MIN_SWEEPS = 10  # fewer readings than this: no shape is read
SETTLE_FRACTION = 0.2  # the curve's first 20% (start-up allocation) is left out of the shape tests
PLATEAU_BAND = 0.02  # of the GPUs' total: the settled curve stays inside this band -> plateau
SAW_MIN_AMPLITUDE = 0.005  # of total: a tooth rises and falls back by at least this much
SAW_MIN_TEETH = 3  # ... this many times -> sawtooth
RISE_MIN = 0.05  # of total: the settled curve gains at least this much ...
RISE_MONOTONE = 0.8  # ... with at least 80% of its movement upward -> smooth rise
NEAR_LIMIT = 0.90  # peak / total at or above: transients or a rise close to the limit (warning)
AT_LIMIT = 0.95  # peak / total at or above: at the limit (critical for a rise)
POOL_TOLERANCE = 0.05  # plateau within +-5% of total of mem_fraction_static x total: the pool's level
OOM_DROP = 0.5  # used memory falling under half its peak mid-run: the engine let its memory go (it died)
OOM_WORDS = ("out of memory", "outofmemory", "cuda oom", " oom", "oom:", "cudaerrormemoryallocation")


def curve(result: TrialResult) -> tuple[np.ndarray, np.ndarray, float] | None:
    """(t_s, used bytes, total bytes) per sweep, summed over the GPUs; None without a usable curve."""
    samples = (result.gpu or {}).get("samples") or []
    sweeps: list[list[dict[str, Any]]] = []
    seen: set[int] = set()
    for s in samples:
        if s.get("mem_used") is None:
            continue
        g = int(s.get("gpu", 0))
        if g in seen or not sweeps:
            sweeps.append([])
            seen = set()
        seen.add(g)
        sweeps[-1].append(s)
    if len(sweeps) < MIN_SWEEPS:
        return None
    t = np.array([sw[0]["t_s"] for sw in sweeps], dtype=np.float64)
    used = np.array([sum(float(s["mem_used"]) for s in sw) for sw in sweeps], dtype=np.float64)
    totals = [sum(float(s.get("mem_total") or 0) for s in sw) for sw in sweeps]
    total = max(totals)
    return (t, used, total) if total > 0 else None


def teeth(values: np.ndarray, amplitude: float) -> int:
    """Rise-and-fall cycles of at least ``amplitude`` (hysteresis, so noise below it counts nothing)."""
    low = high = float(values[0])
    rising, n = False, 0
    for v in values[1:].tolist():
        if not rising:
            low = min(low, v)
            if v >= low + amplitude:
                rising, high = True, v
        else:
            high = max(high, v)
            if v <= high - amplitude:
                n += 1
                rising, low = False, v
    return n


def _oom_signs(result: TrialResult, used: np.ndarray) -> list[str]:
    """Why we think the engine ran out of memory: an error text, or its memory let go mid-run."""
    signs = []
    texts = [result.failure_reason or ""] + [r.error_message or "" for r in result.records if r.error_message]
    if any(w in t.lower() for t in texts for w in OOM_WORDS):
        signs.append("an error names out-of-memory")
    peak_at = int(np.argmax(used))
    after = used[peak_at:]
    if after.size > 1 and float(after.min()) < OOM_DROP * float(used[peak_at]):
        signs.append(f"used memory fell from {used[peak_at] / 1e9:.1f} to {after.min() / 1e9:.1f} GB mid-run")
    return signs


def diagnose(result: TrialResult) -> list[Finding]:
    c = curve(result)
    tid = result.trial_id
    if c is None:
        state = (result.gpu or {}).get("state") or result.summary.gpu_state
        return [Finding(trial_id=tid, kind="memory.no_curve", severity="info",
                        summary=f"no GPU memory curve to read (sampler state {state}, fewer than {MIN_SWEEPS} readings"
                                " or none)", evidence={"gpu_state": state})]
    t, used, total = c
    settled = used[int(len(used) * SETTLE_FRACTION):]
    peak = float(used.max())
    mfs = flag(result, "mem_fraction_static")
    chunk = flag(result, "chunked_prefill_size")
    ev: dict[str, Any] = {
        "sweeps": int(len(used)), "total_gb": r3(total / 1e9), "start_gb": r3(used[0] / 1e9),
        "peak_gb": r3(peak / 1e9), "peak_fraction": r3(peak / total),
        "settled_range_fraction": r3((settled.max() - settled.min()) / total),
        "simulated": (result.gpu or {}).get("state") == "simulated",
    }
    if mfs is not None:
        ev["mem_fraction_static"] = float(mfs)
    oom = _oom_signs(result, used)
    if oom:
        expected = float(mfs) if mfs is not None else NEAR_LIMIT
        ev.update(oom_signs=oom, expected_fraction=expected)
        if peak / total < expected - POOL_TOLERANCE:
            return [Finding(
                trial_id=tid, kind="memory.early_oom", severity="critical", evidence=ev,
                summary=f"out of memory at {peak / total:.0%} of the GPU, below the {expected:.0%} expected:"
                        " fragmentation or a reserve too small for activations and graphs",
                advice="raise the reserve (lower --mem-fraction-static) so activations and CUDA graphs fit beside"
                       " the pool; check gpu_clean_at_start (another process may hold memory)")]
        return [Finding(
            trial_id=tid, kind="memory.rise_to_oom", severity="critical", evidence=ev,
            summary=f"memory rose to {peak / total:.0%} of the GPU and the engine ran out of it",
            advice="lower --max-running-requests (fewer sequences hold KV at once) or raise the reserve"
                   " (lower --mem-fraction-static)")]
    amp = SAW_MIN_AMPLITUDE * total
    n_teeth = teeth(settled, amp)
    ev["teeth"] = n_teeth
    if n_teeth >= SAW_MIN_TEETH:
        ev["chunked_prefill_size"] = chunk
        tooth = float(np.percentile(settled, 95) - np.percentile(settled, 5))
        ev["tooth_gb"] = r3(tooth / 1e9)
        return [Finding(
            trial_id=tid, kind="memory.sawtooth", severity="warning" if peak / total >= NEAR_LIMIT else "info",
            evidence=ev,
            summary=f"sawtooth: {n_teeth} rises and falls of about {tooth / 1e9:.2f} GB (prefill activations)"
                    f" on top of {settled.min() / 1e9:.1f} GB; peak {peak / total:.0%} of the GPU",
            advice=f"lower --chunked-prefill-size (now {chunk if chunk is not None else 'the default'}):"
                   " smaller prefill chunks need smaller transients")]
    moves = np.diff(settled)
    gain = float(settled[-1] - settled[0])
    moved = float(np.abs(moves).sum())
    up_share = float(moves[moves > 0].sum()) / moved if moved > 0 else 0.0
    ev.update(settled_gain_fraction=r3(gain / total), up_share=r3(up_share))
    if gain >= RISE_MIN * total and up_share >= RISE_MONOTONE:
        sev = "critical" if peak / total >= AT_LIMIT else "warning"
        return [Finding(
            trial_id=tid, kind="memory.smooth_rise", severity=sev, evidence=ev,
            summary=f"smooth rise of {gain / 1e9:.1f} GB over the run to {peak / total:.0%} of the GPU"
                    " (memory grows with the tokens held: KV accumulation)",
            advice="lower --max-running-requests or raise the reserve (lower --mem-fraction-static) before it"
                   " reaches the limit")]
    if (settled.max() - settled.min()) <= PLATEAU_BAND * total:
        level = float(np.median(settled)) / total
        ev["level_fraction"] = r3(level)
        if mfs is not None and abs(level - float(mfs)) <= POOL_TOLERANCE:
            text = (f"plateau at {level:.1%} of the GPU, the pool's level (mem_fraction_static {float(mfs):g}):"
                    " normal pooling")
        elif mfs is not None:
            text = (f"plateau at {level:.1%} of the GPU, off the pool's level (mem_fraction_static {float(mfs):g}):"
                    " another allocation beside the pool")
        else:
            text = f"plateau at {level:.1%} of the GPU (preallocated; no mem_fraction_static to compare with)"
        return [Finding(trial_id=tid, kind="memory.plateau", severity="info", summary=text, evidence=ev)]
    return [Finding(trial_id=tid, kind="memory.irregular", severity="info", evidence=ev,
                    summary=f"memory moved by {ev['settled_range_fraction']:.1%} of the GPU without a clear shape")]
