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


class SamplingThread:
    """``sample`` on a steady cadence in a daemon thread, from ``start()`` until ``stop()``."""

    def __init__(self, interval_s: float, sample: Callable[[], None], name: str):
        self._stop = threading.Event()
        self._missed = 0

        def loop() -> None:
            self._missed = run_every(interval_s, sample, self._stop)

        self._thread = threading.Thread(target=loop, name=name, daemon=True)

    def start(self) -> SamplingThread:
        self._thread.start()
        return self

    def stop(self) -> int:
        """Stop and join; the ticks missed because a sample overran."""
        self._stop.set()
        self._thread.join()
        return self._missed
