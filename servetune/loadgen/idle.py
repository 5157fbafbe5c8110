"""The stream idle timeout: a request whose stream sends no byte for ``idle_timeout_s`` fails.

A hung engine (or a proxy that keeps the socket open) would otherwise hold a concurrency slot for
the whole ``timeout_s``. One task looks at every in-flight request a few times per idle period
and reads the arrival stamps the hot path already appends (capture.py), so a chunk costs nothing
extra; an idle request's own ``asyncio.timeout`` is made due now, so it ends the way a total
timeout does and ``fired`` tells the two apart.
"""

from __future__ import annotations

import asyncio
import time

from servetune.records import ErrorClass

IDLE_TIMEOUT = ErrorClass.IDLE_TIMEOUT  #: the error class of a request failed by the idle timeout


class IdleWatch:
    """Watches in-flight requests; ``run()`` is the checking task (cancel it when the load ends)."""

    def __init__(self, idle_s: float) -> None:
        self.idle_s = idle_s
        self._idle_ns = int(idle_s * 1e9)
        self.tick_s = min(1.0, max(0.01, idle_s / 20))  # late by at most one tick: 5% of the bound
        self._active: dict[int, list] = {}  # i -> [last sign of life (ns), arrival stamps, its timeout]
        self.fired: set[int] = set()

    def watch(self, i: int, t_send_ns: int, times: list[int], deadline: asyncio.Timeout) -> None:
        self._active[i] = [t_send_ns, times, deadline]

    def alive(self, i: int) -> None:
        """The response's headers came: a byte, though not one the stamps hold."""
        entry = self._active.get(i)
        if entry is not None:
            entry[0] = time.perf_counter_ns()

    def forget(self, i: int) -> None:
        self._active.pop(i, None)
        self.fired.discard(i)

    def silent_s(self, i: int) -> float:
        """Seconds since request ``i`` last sent a byte (for its error message)."""
        entry = self._active.get(i)
        if entry is None:
            return 0.0
        times = entry[1]
        last = max(entry[0], times[-1]) if times else entry[0]
        return (time.perf_counter_ns() - last) / 1e9

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        clock, limit = time.perf_counter_ns, self._idle_ns
        while True:
            await asyncio.sleep(self.tick_s)
            now = clock()
            for i, (last, times, deadline) in list(self._active.items()):
                if times and times[-1] > last:
                    last = times[-1]
                if now - last > limit and i not in self.fired:
                    self.fired.add(i)
                    try:
                        deadline.reschedule(loop.time())
                    except RuntimeError:  # its timeout already exited: the request is ending anyway
                        self.fired.discard(i)
