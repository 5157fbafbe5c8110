"""Energy and cost of one trial over its steady window (docs/metrics.md, "Energy and cost").

NVML's total-energy counter, read with every GPU sample, gives the energy between two instants exactly;
the power curve is a reading every interval, so its integral is the fallback where the counter is
missing or not monotonic, and the method is recorded. Where both exist both are computed, and their
ratio is kept as evidence that the two agree. A simulated GPU's power is modelled and says so.
Energy is taken over the same window as throughput, so J per token is power / tokens-per-second.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from servetune.result import TrialSummary

COUNTER, CURVE, MODELLED = "counter", "power_curve", "modelled"
UNAVAILABLE = "unavailable"  # a GPU trial with a window whose samples gave no energy: the checklist rejects it


class Cost(BaseModel):
    """What the GPUs cost: a price per GPU-hour (all in; the energy is not priced apart)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    gpu_hour_usd: float = Field(gt=0, le=10_000, description="price of one GPU for one hour, in USD")


def _at(t: np.ndarray, v: np.ndarray, x: float) -> float:
    return float(np.interp(x, t, v))


def _integral(t: np.ndarray, w: np.ndarray, start: float, end: float) -> float:
    """Trapezoids of the power curve over [start, end], the curve read linearly at both ends."""
    inside = (t > start) & (t < end)
    ts = np.concatenate(([start], t[inside], [end]))
    ws = np.concatenate(([_at(t, w, start)], w[inside], [_at(t, w, end)]))
    return float(np.sum((ws[1:] + ws[:-1]) * np.diff(ts)) / 2.0)


def _covers(t: np.ndarray, start: float, end: float, slack: float) -> bool:
    return t.size >= 2 and t[0] <= start + slack and t[-1] >= end - slack


def gpu_energy(samples: list[dict[str, Any]], start: float, end: float, slack: float) -> dict[str, Any] | None:
    """One GPU's energy over [start, end] from its samples (sorted by time); None when they do not cover it."""
    t = np.array([float(x["t_s"]) for x in samples])
    if not _covers(t, start, end, slack):
        return None
    out: dict[str, Any] = {"joules_counter": None, "joules_curve": None, "peak_w": None}
    counted = [x.get("energy_mj") for x in samples]
    if all(isinstance(c, int | float) for c in counted):
        c = np.array(counted, dtype=float) / 1000.0
        out["counter_monotonic"] = bool(np.all(np.diff(c) >= 0))
        if out["counter_monotonic"]:
            out["joules_counter"] = _at(t, c, end) - _at(t, c, start)
    powered = [x.get("power_w") for x in samples]
    if all(isinstance(p, int | float) for p in powered):
        w = np.array(powered, dtype=float)
        out["joules_curve"] = _integral(t, w, start, end)
        in_window = w[(t >= start) & (t <= end)]
        out["peak_w"] = float(in_window.max()) if in_window.size else max(_at(t, w, start), _at(t, w, end))
    if out["joules_counter"] is None and out["joules_curve"] is None:
        return None
    return out


def window_energy(gpu: dict[str, Any] | None, start: float | None, end: float | None) -> dict[str, Any] | None:
    """The ``energy`` part of a summary: per GPU and summed over [start, end], with the method used."""
    if not gpu or start is None or end is None or end <= start:
        return None
    samples = gpu.get("samples") or []
    slack = 2.0 * float(gpu.get("interval_ms") or 100.0) / 1000.0
    limits = {int(d["index"]): d.get("power_limit_w") for d in gpu.get("devices") or [] if "index" in d}
    per_gpu: list[dict[str, Any]] = []
    for g in sorted({int(x.get("gpu", 0)) for x in samples}):
        mine = sorted((x for x in samples if int(x.get("gpu", 0)) == g), key=lambda x: float(x["t_s"]))
        e = gpu_energy(mine, start, end, slack)
        if e is None:
            return None  # one GPU without a reading over the window: no total would be honest
        per_gpu.append({"gpu": g, **e, "limit_w": limits.get(g)})
    if not per_gpu:
        return None
    counted = all(e["joules_counter"] is not None for e in per_gpu)
    method = MODELLED if gpu.get("state") == "simulated" else COUNTER if counted else CURVE
    for e in per_gpu:
        e["joules"] = e["joules_counter"] if counted else e["joules_curve"]
        e["mean_w"] = e["joules"] / (end - start)
    total = sum(e["joules"] for e in per_gpu)
    curve = [e["joules_curve"] for e in per_gpu]
    agree = (sum(curve) / total) if counted and all(c is not None for c in curve) and total > 0 else None
    peaks = [e["peak_w"] for e in per_gpu]
    return {"method": method, "window_s": end - start, "joules": total, "mean_w": total / (end - start),
            "peak_w": sum(peaks) if all(p is not None for p in peaks) else None,
            "curve_over_counter": agree, "gpus": per_gpu}


def apply_energy(s: TrialSummary, gpu: dict[str, Any] | None, cost: Cost | None = None) -> None:
    """Energy per request and per output token over the summary's window, then the cost at that throughput."""
    e = window_energy(gpu, s.window_start_s, s.window_end_s)
    if e is None and (gpu or {}).get("state") in ("ok", "simulated") and s.window_s:
        s.energy_method = UNAVAILABLE
    if e is not None:
        s.energy = e
        s.energy_method, s.energy_j = e["method"], e["joules"]
        s.gpu_power_window_mean_w, s.gpu_power_peak_w = e["mean_w"], e["peak_w"]
        s.energy_curve_over_counter = e["curve_over_counter"]
        window = e["window_s"]
        if s.request_throughput:
            s.energy_per_request_j = e["joules"] / (s.request_throughput * window)
        if s.output_tokens_per_s:
            s.energy_per_output_token_j = e["joules"] / (s.output_tokens_per_s * window)
    if cost is not None:
        gpus = len((gpu or {}).get("devices") or []) or 1
        usd_per_s = cost.gpu_hour_usd * gpus / 3600.0
        s.cost_gpu_hour_usd, s.cost_gpus = cost.gpu_hour_usd, gpus
        if s.output_tokens_per_s:
            s.cost_per_mtok_usd = usd_per_s / s.output_tokens_per_s * 1e6
        if s.goodput_rps:
            s.cost_per_1k_good_usd = usd_per_s / s.goodput_rps * 1e3


__all__ = ["COUNTER", "CURVE", "MODELLED", "UNAVAILABLE", "Cost", "apply_energy", "gpu_energy", "window_energy"]
