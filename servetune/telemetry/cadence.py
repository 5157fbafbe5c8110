"""A steady sampling cadence for telemetry threads: ticks on a fixed grid, overruns skip ticks, no drift."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


def run_every(interval_s: float, sample: Callable[[], None], stop: threading.Event) -> int:
    """Call ``sample`` at t0, t0 + interval, ... until ``stop`` is set; returns the ticks missed.

    A sample that overruns skips the ticks it covered instead of shifting every later one, so the
    curve stays on the grid the trial's window is cut from.
    """
    interval_ns = int(interval_s * 1e9)
    begin, k, missed = time.perf_counter_ns(), 0, 0
    while True:
        sample()
        k += 1
        now = time.perf_counter_ns()
        due = begin + k * interval_ns
        if now > due:
            late = (now - due) // interval_ns + 1
            missed += int(late)
            k += int(late)
            due = begin + k * interval_ns
        if stop.wait((due - now) / 1e9):
            return missed
