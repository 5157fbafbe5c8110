"""GPU memory, utilisation, power and energy over a trial, sampled through NVML.

The memory curve is part of every result (docs/telemetry.md), so sampling runs in its own daemon thread
on a fixed schedule (ticks at t_start + k*interval on perf_counter; a late tick is skipped and
counted, never bunched up), independent of the event loop that drives the load. A machine without
NVML yields an explicit ``no_gpu`` state, never an exception. GPU indices are NVML's (physical)
indices, not CUDA_VISIBLE_DEVICES ordinals.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

from servetune.telemetry.cadence import SamplingThread

log = logging.getLogger(__name__)

_NO_GPU_ERRORS = ("NVMLError_LibraryNotFound", "NVMLError_DriverNotLoaded")


class GpuUnavailable(RuntimeError):
    """NVML cannot be used here (no library, no driver, no GPU); the message says which."""


def _pynvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:  # nvidia-ml-py is a dependency, but say so plainly if it is gone
        raise GpuUnavailable(f"nvidia-ml-py is not installed: {exc}") from exc
    return pynvml


@contextmanager
def nvml_session() -> Iterator[Any]:
    """``nvmlInit`` .. ``nvmlShutdown`` (reference counted by NVML); yields the pynvml module."""
    nv = _pynvml()
    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        raise GpuUnavailable(f"NVML unavailable: {type(exc).__name__}: {exc}") from exc
    try:
        yield nv
    finally:
        with suppress(nv.NVMLError):
            nv.nvmlShutdown()


def _resolve_indices(nv: Any, indices: Iterable[int] | None) -> list[int]:
    count = nv.nvmlDeviceGetCount()
    if count == 0:
        raise GpuUnavailable("NVML found no GPU")
    if indices is None:
        return list(range(count))
    chosen = list(indices)
    bad = [i for i in chosen if not 0 <= i < count]
    if bad:
        raise GpuUnavailable(f"GPU index {bad} out of range: NVML sees {count} GPU(s)")
    return chosen


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _optional(fn: Any, *args: Any) -> Any:
    """NVML fields that some GPUs or drivers do not support come back as None."""
    nv = _pynvml()
    try:
        return fn(*args)
    except nv.NVMLError:
        return None


def _cuda_version(nv: Any) -> str | None:
    v = _optional(nv.nvmlSystemGetCudaDriverVersion)
    return f"{v // 1000}.{(v % 1000) // 10}" if v else None


def _device_info(nv: Any, index: int) -> dict[str, Any]:
    h = nv.nvmlDeviceGetHandleByIndex(index)
    mem = nv.nvmlDeviceGetMemoryInfo(h)
    return {
        "index": index,
        "name": _text(nv.nvmlDeviceGetName(h)),
        "uuid": _text(nv.nvmlDeviceGetUUID(h)),
        "mem_total": int(mem.total),
        "power_limit_w": limit / 1000.0 if (limit := _optional(nv.nvmlDeviceGetEnforcedPowerLimit, h)) else None,
        "driver": _text(nv.nvmlSystemGetDriverVersion()),
        "cuda": _cuda_version(nv),
    }


def _processes(nv: Any, indices: list[int], own_pids: set[int] | None = None) -> list[dict[str, Any]]:
    import psutil

    out: list[dict[str, Any]] = []
    for i in indices:
        h = nv.nvmlDeviceGetHandleByIndex(i)
        seen: set[int] = set()
        for getter in (nv.nvmlDeviceGetComputeRunningProcesses, nv.nvmlDeviceGetGraphicsRunningProcesses):
            for p in _optional(getter, h) or []:
                if p.pid in seen:
                    continue
                seen.add(p.pid)
                used = getattr(p, "usedGpuMemory", None)
                entry: dict[str, Any] = {
                    "gpu": i,
                    "pid": int(p.pid),
                    "name": None,
                    "used_memory": int(used) if isinstance(used, int) and used >= 0 else None,
                }
                try:
                    proc = psutil.Process(p.pid)
                    entry["name"] = proc.name()
                    lineage = {proc.pid} | {q.pid for q in proc.parents()}
                except (psutil.Error, OSError):  # another PID namespace (containers) or gone
                    lineage = {p.pid}
                if own_pids is not None:
                    entry["foreign"] = not (lineage & own_pids)
                out.append(entry)
    return out


def gpu_processes(
    indices: Iterable[int] | None = None, *, own_pids: Iterable[int] | None = None
) -> list[dict]:
    """Processes holding the GPUs now: ``{gpu, pid, name, used_memory[, foreign]}``.

    With ``own_pids`` (e.g. the server under test), each entry says whether it is ``foreign``
    (neither one of those PIDs nor their child). Raises ``GpuUnavailable`` without NVML: an
    empty list would wrongly claim a clean GPU.
    """
    with nvml_session() as nv:
        return _processes(nv, _resolve_indices(nv, indices), set(own_pids) if own_pids is not None else None)


def gpu_memory_used(indices: Iterable[int] | None = None) -> dict[int, int]:
    """Bytes of memory in use per GPU index now. Raises ``GpuUnavailable`` without NVML."""
    with nvml_session() as nv:
        return {
            i: int(nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(i)).used)
            for i in _resolve_indices(nv, indices)
        }


class GpuSampler:
    """Samples every chosen GPU each ``interval_s`` from ``start(t0_ns)`` to ``stop()``.

    ``stop()`` returns the ``gpu`` part of a trial result::

        {state: ok|no_gpu|error, reason, interval_ms, devices, processes_at_start,
         samples: [{t_s, gpu, mem_used, mem_total, util, power_w, energy_mj}], missed_ticks, sample_errors}

    ``energy_mj`` is NVML's total-energy counter (mJ since the driver loaded; None before Volta): the
    energy between two samples exactly, where the power curve is only a reading every interval.

    ``t_s`` is seconds since ``t0_ns`` (a ``time.perf_counter_ns()`` value, the trial's t0).
    """

    def __init__(
        self,
        interval_s: float = 0.1,
        gpu_indices: Iterable[int] | None = None,
        *,
        own_pids: Iterable[int] | None = None,
    ):
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.interval_s = interval_s
        self.gpu_indices = list(gpu_indices) if gpu_indices is not None else None
        self.own_pids = set(own_pids) if own_pids is not None else None
        self._state = "idle"
        self._reason: str | None = None
        self._devices: list[dict[str, Any]] = []
        self._procs: list[dict[str, Any]] = []
        self._samples: list[dict[str, Any]] = []
        self._missed = 0
        self._errors = 0
        self._thread: SamplingThread | None = None
        self._nv: Any = None
        self._handles: list[tuple[int, Any]] = []
        self._t0_ns = 0

    # --- lifecycle
    def start(self, t0_ns: int | None = None) -> GpuSampler:
        if self._state != "idle":
            raise RuntimeError("GpuSampler.start() called twice")
        self._t0_ns = time.perf_counter_ns() if t0_ns is None else t0_ns
        try:
            nv = _pynvml()
            nv.nvmlInit()
        except GpuUnavailable as exc:
            return self._give_up("no_gpu", str(exc))
        except Exception as exc:
            state = "no_gpu" if type(exc).__name__ in _NO_GPU_ERRORS else "error"
            return self._give_up(state, f"nvmlInit: {type(exc).__name__}: {exc}")
        self._nv = nv
        try:
            indices = _resolve_indices(nv, self.gpu_indices)
            self._devices = [_device_info(nv, i) for i in indices]
            self._handles = [(i, nv.nvmlDeviceGetHandleByIndex(i)) for i in indices]
            self._procs = _processes(nv, indices, self.own_pids)
        except GpuUnavailable as exc:
            self._shutdown()
            return self._give_up("no_gpu", str(exc))
        except Exception as exc:
            self._shutdown()
            return self._give_up("error", f"{type(exc).__name__}: {exc}")
        self._state = "ok"
        self._thread = SamplingThread(self.interval_s, self._sample_all, "servetune-gpu-sampler").start()
        return self

    def stop(self) -> dict[str, Any]:
        if self._thread is not None:
            self._missed += self._thread.stop()
            self._thread = None
            self._sample_all()  # one reading at the very end, so the curve covers the window
            self._shutdown()
        elif self._state == "idle":
            self._give_up("error", "stop() without start()")
        return self.result()

    def result(self) -> dict[str, Any]:
        return {
            "state": self._state,
            "reason": self._reason,
            "interval_ms": self.interval_s * 1000.0,
            "devices": list(self._devices),
            "processes_at_start": list(self._procs),
            "samples": list(self._samples),
            "missed_ticks": self._missed,
            "sample_errors": self._errors,
        }

    def __enter__(self) -> GpuSampler:
        if self._state == "idle":
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- internals
    def _give_up(self, state: str, reason: str) -> GpuSampler:
        self._state, self._reason = state, reason
        log.info("GPU sampling off: %s", reason)
        return self

    def _shutdown(self) -> None:
        if self._nv is not None:
            with suppress(Exception):  # shutting down is best effort
                self._nv.nvmlShutdown()
            self._nv = None

    def _sample_all(self) -> None:
        nv = self._nv
        for index, h in self._handles:
            t_s = (time.perf_counter_ns() - self._t0_ns) / 1e9
            try:
                mem = nv.nvmlDeviceGetMemoryInfo(h)
            except Exception as exc:
                self._errors += 1
                if self._reason is None:
                    self._reason = f"sampling GPU {index}: {type(exc).__name__}: {exc}"
                continue
            util = _optional(nv.nvmlDeviceGetUtilizationRates, h)
            power_mw = _optional(nv.nvmlDeviceGetPowerUsage, h)
            energy_mj = _optional(nv.nvmlDeviceGetTotalEnergyConsumption, h)
            self._samples.append(
                {
                    "t_s": t_s,
                    "gpu": index,
                    "mem_used": int(mem.used),
                    "mem_total": int(mem.total),
                    "util": float(util.gpu) if util is not None else None,
                    "power_w": power_mw / 1000.0 if power_mw is not None else None,
                    "energy_mj": int(energy_mj) if energy_mj is not None else None,
                }
            )
