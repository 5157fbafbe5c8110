"""GPU telemetry of a simulated engine: its modelled GPUs, sampled like NVML's.

A simulated SGLang server (servetune.sim) has no GPU to read, but it models one: ``GET /sim/gpu``
gives the modelled memory in use (SGLang's preallocation plus activations) and the engine's busy
time. Sampling that at the same cadence gives the trial a memory curve marked ``simulated``, so a
demo's result is complete and never passes for a measurement.
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

from servetune.telemetry.cadence import SamplingThread


class SimulatedGpuSampler:
    """Same interface and result shape as ``GpuSampler``, fed by the sim's ``/sim/gpu``."""

    def __init__(self, url: str, interval_s: float = 0.1, headers: dict[str, str] | None = None):
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.url = url.rstrip("/") + "/sim/gpu"
        self.interval_s = interval_s
        self.headers = headers or {}
        self._samples: list[dict[str, Any]] = []
        self._devices: list[dict[str, Any]] = []
        self._errors = 0
        self._missed = 0
        self._reason: str | None = None
        self._state = "idle"
        self._last: tuple[float, float, float] | None = None  # (model time, busy, active time) of the previous reading
        self._thread: SamplingThread | None = None
        self._t0_ns = 0

    def _read(self) -> dict[str, Any]:
        req = urllib.request.Request(self.url, headers=self.headers)
        with urllib.request.urlopen(req, timeout=max(1.0, 5 * self.interval_s)) as resp:
            return json.loads(resp.read())

    def start(self, t0_ns: int | None = None) -> SimulatedGpuSampler:
        self._t0_ns = time.perf_counter_ns() if t0_ns is None else t0_ns
        try:
            first = self._read()
        except Exception as exc:  # noqa: BLE001 - reported in the result, like NVML's absence
            self._state, self._reason = "error", f"{self.url}: {type(exc).__name__}: {exc}"
            return self
        self._devices = [{**{k: d[k] for k in ("index", "name", "uuid", "mem_total")},
                          "power_limit_w": float(first["tdp_w"])} for d in first["devices"]]
        self._state = "simulated"
        self._record(first)
        self._thread = SamplingThread(self.interval_s, self._sample, "servetune-sim-gpu").start()
        return self

    def stop(self) -> dict[str, Any]:
        if self._thread is not None:
            self._missed += self._thread.stop()
            self._thread = None
            self._sample()
        return {
            "state": self._state,
            "reason": self._reason or "simulated engine: modelled GPUs (servetune.sim), not a measurement",
            "interval_ms": self.interval_s * 1000.0,
            "devices": self._devices,
            "processes_at_start": [],
            "samples": self._samples,
            "missed_ticks": self._missed,
            "sample_errors": self._errors,
        }

    def _sample(self) -> None:
        try:
            self._record(self._read())
        except Exception as exc:  # noqa: BLE001 - a missed reading is counted, the curve goes on
            self._errors += 1
            self._reason = self._reason or f"{type(exc).__name__}: {exc}"

    def _record(self, data: dict[str, Any]) -> None:
        t_s = (time.perf_counter_ns() - self._t0_ns) / 1e9
        t_model, busy = float(data["t_model_s"]), float(data["busy_s"])
        active = float(data.get("active_s", busy))  # passes weighted by the power they draw (servetune.sim.power)
        util = share = 0.0
        if self._last is not None and t_model > self._last[0]:
            span = t_model - self._last[0]
            util = min(1.0, max(0.0, (busy - self._last[1]) / span))
            share = min(1.0, max(0.0, (active - self._last[2]) / span))
        self._last = (t_model, busy, active)
        power = data["idle_w"] + (data["tdp_w"] - data["idle_w"]) * share
        for d in data["devices"]:
            self._samples.append({"t_s": t_s, "gpu": d["index"], "mem_used": int(d["mem_used"]),
                                  "mem_total": int(d["mem_total"]), "util": round(util * 100.0, 1),
                                  "power_w": round(power, 1)})
