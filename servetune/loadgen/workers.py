"""One load over several client processes, for stream counts one event loop cannot stamp on time.

Each worker is its own process (spawned: the parent may run sampler threads), with its own event loop,
connection pool and share of the load: the units (requests or sessions) dealt round-robin, the closed
loop's streams or the open loop's in-flight cap split evenly, an open loop's arrivals at their times
in the one schedule computed here. Every worker stamps with ``perf_counter_ns`` (CLOCK_MONOTONIC on
Linux: one clock for every process), relative to the parent's ``t0_ns``; they start together at a
time the parent names once all of them are ready, and their records merge back in request order.
``worker_count`` picks the number from the streams and the cores (docs/benchmarks.md, issue 18).
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import os
import pickle
import threading
import time
from collections.abc import Sequence
from typing import Any

from servetune.workload.request import WorkloadRequest

from .client import LoadOutcome, Share, run_load
from .config import LoadConfig, Target
from .sessions import load_units
from .strategies import arrival_offsets_s

STREAMS_PER_WORKER = 256  # one event loop holds 256 streams within a millisecond (docs/benchmarks.md)
START_MARGIN_S = 0.05  # between naming the common start and reaching it
READY_TIMEOUT_S = 120.0


def worker_count(streams: int, pinned: int | None = None) -> int:
    """``pinned`` when given; else one worker per 256 streams, at most one per core but one (the
    server or the tokenizer may need it), never fewer than one."""
    if pinned is not None:
        if pinned < 1:
            raise ValueError(f"workers must be >= 1, got {pinned}")
        return pinned
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores - 1, math.ceil(streams / STREAMS_PER_WORKER)))


def _shares(requests: Sequence[WorkloadRequest], load: LoadConfig, workers: int) -> list[dict[str, Any]]:
    units = load_units(requests)
    workers = min(workers, len(units), load.concurrency)
    offsets = (arrival_offsets_s(load, len(units), [requests[u[0]] for u in units]) if load.mode == "rate"
               else None)
    base, extra = divmod(load.concurrency, workers)
    out = []
    for k in range(workers):
        mine = list(range(k, len(units), workers))
        index = [i for u in mine for i in units[u]]
        out.append({
            "index": index,
            "requests": [requests[i] for i in index],
            "warm": [i < load.warmup_requests for i in index],
            "offsets_s": [offsets[u] for u in mine] if offsets is not None else None,
            "load": load.model_copy(update={"concurrency": base + (k < extra), "warmup_requests": 0}),
        })
    return out


def _worker_main(conn: Any, blob: bytes) -> None:
    """A worker process: get ready, wait for the common start, run its share, send the outcome back."""
    job = pickle.loads(blob)
    stop = asyncio.Event()

    async def main() -> LoadOutcome:
        loop = asyncio.get_running_loop()

        async def start() -> int:
            conn.send("ready")
            begin = await loop.run_in_executor(None, conn.recv)

            def listen() -> None:  # the parent says "stop" (a stopped bench) or closes the pipe
                try:
                    if conn.recv() == "stop":
                        loop.call_soon_threadsafe(stop.set)
                except (EOFError, OSError):
                    pass

            threading.Thread(target=listen, daemon=True).start()
            return begin

        share = Share(warm=job["warm"], offsets_s=job["offsets_s"], start=start)
        return await run_load(job["target"], job["requests"], job["load"], t0_ns=job["t0_ns"],
                              tokenizer=job["tokenizer"], stop=stop, share=share)

    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        runner = asyncio.Runner()
    with runner:
        try:
            conn.send(("ok", runner.run(main())))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


async def run_load_workers(
    target: Target, requests: list[WorkloadRequest], load: LoadConfig, *, t0_ns: int, workers: int,
    tokenizer: Any = None, stop: asyncio.Event | None = None,
) -> LoadOutcome:
    """``run_load`` over ``workers`` processes (no per-request progress: each worker reports at its end)."""
    if not requests:
        raise ValueError("requests: nothing to send")
    if load.warmup_requests >= len(requests):
        raise ValueError(f"warmup_requests ({load.warmup_requests}) must be fewer than the requests ({len(requests)})")
    try:
        pickle.dumps(tokenizer)
    except Exception:  # noqa: BLE001 - a tokenizer that cannot travel: the workers count with usage
        tokenizer = None
    ctx = multiprocessing.get_context("spawn")
    loop = asyncio.get_running_loop()
    shares = _shares(requests, load, workers)
    procs, conns = [], []
    try:
        for share in shares:
            parent, child = ctx.Pipe()
            job = {"target": target, "requests": share["requests"], "load": share["load"], "warm": share["warm"],
                   "offsets_s": share["offsets_s"], "t0_ns": t0_ns, "tokenizer": tokenizer}
            p = ctx.Process(target=_worker_main, args=(child, pickle.dumps(job)), daemon=True)
            p.start()
            child.close()
            procs.append(p)
            conns.append(parent)
        for conn in conns:
            if not await loop.run_in_executor(None, conn.poll, READY_TIMEOUT_S):
                raise RuntimeError(f"a load worker was not ready within {READY_TIMEOUT_S:g} s")
            first = conn.recv()
            if first != "ready":
                raise RuntimeError(f"a load worker failed before the start: {first[1]}")
        begin = time.perf_counter_ns() + int(START_MARGIN_S * 1e9)
        for conn in conns:
            conn.send(begin)
        watcher = asyncio.create_task(_forward_stop(stop, conns)) if stop is not None else None
        try:
            replies = await asyncio.gather(*(loop.run_in_executor(None, conn.recv) for conn in conns))
        finally:
            if watcher is not None:
                watcher.cancel()
    finally:
        for conn in conns:
            conn.close()
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    failed = [r[1] for r in replies if r[0] != "ok"]
    if failed:
        raise RuntimeError(f"a load worker failed: {failed[0]}")
    return _merge(len(requests), shares, [r[1] for r in replies])


async def _forward_stop(stop: asyncio.Event, conns: list[Any]) -> None:
    await stop.wait()
    for conn in conns:
        try:
            conn.send("stop")
        except OSError:
            pass


def _merged_stamps(kinds: set[str]) -> str:
    """One label for the workers' stamps: the same everywhere, else ``mixed``."""
    return kinds.pop() if len(kinds) == 1 else "mixed"


def _merge(n: int, shares: list[dict[str, Any]], outcomes: list[LoadOutcome]) -> LoadOutcome:
    """One outcome: the records in request order, the window over every worker's measured dispatches,
    the worst worker's client lag (each stamps its own chunks)."""
    placed: list[Any] = [None] * n
    for share, out in zip(shares, outcomes, strict=True):
        sent = {r.request_id: r for r in out.records}
        for i, req in zip(share["index"], share["requests"], strict=True):
            if req.index in sent:
                placed[i] = sent[req.index]
    records = [r for r in placed if r is not None]
    measured = [r for r in records if not r.warmup]
    lags = [o.client_lag_p99_ms for o in outcomes if o.client_lag_p99_ms is not None]
    worst = [o.client_lag_max_ms for o in outcomes if o.client_lag_max_ms is not None]
    return LoadOutcome(
        records,
        min((r.t_send_s for r in measured), default=0.0),
        max((r.t_send_s for r in measured), default=0.0),
        max(o.drain_end_s for o in outcomes),
        any(o.stopped for o in outcomes),
        max(lags) if lags else None,
        max(worst) if worst else None,
        outcomes[0].http_client,
        _merged_stamps({o.arrival_stamps for o in outcomes}),
    )
