"""The client's own event-loop lag: how late a 5 ms ticker wakes, over the load.

A timestamp the client takes itself (a chunk's arrival through aiohttp, a send) is taken when the event loop
gets to it, so a loop busy elsewhere stamps late by as much as it is late to wake. Kernel receive stamps
(loadgen/stamps.py) keep the arrivals exact, but a late loop still reads the chunks that came meanwhile in one
go (they share the last one's stamp) and sends the next requests late. So the trial states its client's lag
over the steady window (p99 and max), and a validity rule (servetune.validity, ``max_client_lag_ms``) refuses a
trial whose client was too busy to referee its TTFT and ITL.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

TICK_S = 0.005


class LoopLag:
    """Run ``tick()`` as a task while the load runs; then ``over(start_s, end_s, t0_ns)``."""

    def __init__(self) -> None:
        self._at: list[int] = []  # when each tick was due, perf_counter_ns
        self._late: list[int] = []  # how late it woke, ns

    async def tick(self) -> None:
        clock = time.perf_counter_ns
        step = int(TICK_S * 1e9)
        due = clock() + step
        while True:
            await asyncio.sleep(max(0, due - clock()) / 1e9)
            now = clock()
            self._at.append(due)
            self._late.append(now - due)
            due = max(due + step, now)  # a long stall counts once, not as a backlog of ticks

    def over(self, start_s: float, end_s: float, t0_ns: int) -> tuple[float | None, float | None]:
        """(p99, max) lag in ms of the ticks due in [start_s, end_s] after ``t0_ns``; None without ticks."""
        if not self._at:
            return None, None
        at = (np.asarray(self._at, dtype=np.int64) - t0_ns) / 1e9
        late = np.asarray(self._late, dtype=np.float64)[(at >= start_s) & (at <= end_s)] / 1e6
        if late.size == 0:
            return None, None
        return float(np.percentile(late, 99)), float(late.max())
