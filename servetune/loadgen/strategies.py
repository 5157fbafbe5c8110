"""When each measured request is due: closed loop (as soon as a stream frees), waves (static batching:
B at once, the next B once all are done) or an open-loop schedule.

Open-loop schedules are computed up front from the seed, so a run is reproducible and the
dispatcher only compares clocks; lateness (timer or concurrency cap) becomes ``queue_ms``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from .config import LoadConfig

if TYPE_CHECKING:
    from servetune.workload.request import WorkloadRequest


def arrival_offsets_s(load: LoadConfig, n: int, requests: Sequence[WorkloadRequest] | None = None) -> list[float]:
    """Due times in seconds after the measured phase starts; the first request is due at 0.
    (``requests``: the load's requests, for arrivals that come with them.)"""
    if load.mode != "rate" or n == 0:
        return [0.0] * n
    if load.arrival == "trace":
        return trace_offsets_s(load, n, requests)
    rate = float(load.rate)  # type: ignore[arg-type]  # validated: set in rate mode
    if load.arrival == "constant":
        return [i / rate for i in range(n)]
    rng = np.random.default_rng(load.seed)
    if load.arrival == "poisson":
        gaps = rng.exponential(1.0 / rate, size=n - 1)
    else:  # gamma: shape = burstiness, mean gap 1/rate (vLLM's --burstiness semantics)
        gaps = rng.gamma(shape=load.burstiness, scale=1.0 / (rate * load.burstiness), size=n - 1)
    if load.exact_rate:
        # 120 Poisson arrivals miss their nominal rate by ~9% (one sigma): a level the tuner compares
        # must be the rate it names, so the sample is stretched to it, the warm-up's gaps and the
        # measured ones (the steady window's) each on their own; its burstiness is kept
        w = min(load.warmup_requests, gaps.size)
        for part in (gaps[:w], gaps[w:]):
            if part.size and part.sum() > 0:
                part *= part.size / rate / part.sum()
    return [0.0, *np.cumsum(gaps).tolist()]


def trace_offsets_s(load: LoadConfig, n: int, requests: Sequence[WorkloadRequest] | None) -> list[float]:
    """The first ``n`` requests' own arrivals, from the first one's; with ``load.rate`` stretched to that mean
    rate, the trace's shape kept (how the tuner's ramp of rates scales one trace). Already exact: no
    ``exact_rate`` step."""
    arrivals = [r.arrival_s for r in (requests or [])[:n]]
    if len(arrivals) < n or any(a is None for a in arrivals):
        raise ValueError("arrival: trace needs a workload with a trace")
    offsets = np.asarray(arrivals, dtype=np.float64) - arrivals[0]
    span = float(offsets.max())
    if load.rate is not None and n > 1 and span > 0:
        offsets *= (n - 1) / load.rate / span  # n - 1 gaps over the span: the mean rate the other arrivals name
    return offsets.tolist()


Send = Callable[[int, int], Awaitable[None]]  # (request index, queue time in ns)


async def closed_loop(indices: list[int], concurrency: int, send: Send) -> None:
    """``concurrency`` streams, each sending its next request as soon as the previous one ends."""
    it = iter(indices)

    async def stream() -> None:
        for i in it:  # the shared iterator hands each index to exactly one stream
            await send(i, 0)

    await asyncio.gather(*(stream() for _ in range(min(concurrency, len(indices)))))


async def waves(indices: list[int], batch: int, send: Send) -> None:
    """Static batching: send ``batch`` units at once, wait for every one of them, then the next ``batch``
    (the batch fills only at each wave's start and drains to its longest request: docs/diagnoses.md)."""
    for k in range(0, len(indices), batch):
        await asyncio.gather(*(send(i, 0) for i in indices[k:k + batch]))


async def open_loop(
    indices: list[int], offsets_s: list[float], cap: int, send: Send, *, start_ns: int | None = None
) -> None:
    """Dispatch request j at ``start_ns + offsets_s[j]``, never more than ``cap`` in flight."""
    slots = asyncio.Semaphore(cap)
    tasks: set[asyncio.Task[None]] = set()
    clock = time.perf_counter_ns
    start = clock() if start_ns is None else start_ns

    async def run(i: int, queue_ns: int) -> None:
        try:
            await send(i, queue_ns)
        finally:
            slots.release()

    try:
        for i, off in zip(indices, offsets_s, strict=True):
            due = start + int(off * 1e9)
            wait = due - clock()
            if wait > 0:
                await asyncio.sleep(wait / 1e9)
            await slots.acquire()
            task = asyncio.create_task(run(i, max(0, clock() - due)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        while tasks:
            await asyncio.gather(*tasks)
    finally:  # cancelled (a stopped load): the requests in flight are not this task's children
        if tasks:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
