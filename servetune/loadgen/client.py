"""run_load: stream every request through one pool of keep-alive connections and record what came back.

The per-chunk hot path is one call per read (transport.py): the read's arrival stamp (the kernel's, where it
gives one), the payload appended. Everything else (SSE splitting, JSON, token counting) waits until the load
is over, or until the streams waiting for it hold DECODE_BACKLOG_BYTES, so the load's CPU goes to reading;
a session's turn is decoded when its stream ends (the next turn carries it).
The load's units are requests, or users' sessions (sessions.py): a session's next turn goes out once
the previous answer has been decoded, carrying it.
Failures are recorded on the request (docs/metrics.md, Errors: never an aborted run); a stream
that goes silent for ``target.idle_timeout_s`` fails as ``idle_timeout`` (idle.py). A ``stop``
event ends the load early (bench on SIGINT/SIGTERM): requests in flight are recorded as
cancelled, requests never sent are left out, and the outcome says it was stopped.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from servetune.records import ErrorClass, RequestRecord
from servetune.workload.request import WorkloadRequest

from .bounded import BoundedReads
from .config import LoadConfig, Target
from .endpoints import decode_stream, request_body, token_counter
from .idle import IDLE_TIMEOUT, IdleWatch
from .lag import LoopLag
from .sessions import is_session, load_units
from .strategies import arrival_offsets_s, closed_loop, open_loop, waves
from .transport import CONNECTION_ERRORS, ERROR_BODY_BYTES, TargetUnreachable, open_transport

__all__ = ["LoadOutcome", "Share", "TargetUnreachable", "run_load", "run_load_sync"]

DECODE_BACKLOG_BYTES = 128 << 20  # streams waiting to be decoded: past this, they are decoded during the load

Progress = Callable[[int, int, int], None]  # (requests done, errors, output tokens)


@dataclass(slots=True)
class Share:
    """One worker's part of a load split over processes: which of its requests are warm-up, its units'
    arrival offsets (open loop, from the whole schedule), and ``start()``: the common start, perf_counter_ns."""

    warm: list[bool]
    offsets_s: list[float] | None
    start: Callable[[], Awaitable[int]]


@dataclass(slots=True)
class LoadOutcome:
    records: list[RequestRecord]  # one per request sent, in request order (a session's turns after a
    # failed one, and requests a stop left unsent, are not)
    window_start_s: float  # first measured dispatch, relative to t0 (the steady window: servetune.validity)
    window_end_s: float  # last measured dispatch
    drain_end_s: float  # every request finished
    stopped: bool = False  # ended early by ``stop``: the requests never sent are not in ``records``
    client_lag_p99_ms: float | None = None  # the client's event loop, late to wake, over the window (lag.py)
    client_lag_max_ms: float | None = None
    http_client: str = "raw"  # the client the requests went through (transport.py)
    arrival_stamps: str = "client"  # who stamped the chunks: "kernel" (each read's receive time), "client", "mixed"


def _classify_status(status: int) -> ErrorClass:
    if status == 503:
        return ErrorClass.REJECTED_503
    return ErrorClass.HTTP_5XX if status >= 500 else ErrorClass.HTTP_4XX


def _redact(text: str, secret: str | None) -> str:
    return text.replace(secret, "***") if secret else text


async def run_load(
    target: Target,
    requests: list[WorkloadRequest],
    load: LoadConfig,
    *,
    t0_ns: int,
    progress: Progress | None = None,
    tokenizer: Any = None,
    stop: asyncio.Event | None = None,
    share: Share | None = None,
) -> LoadOutcome:
    """Send ``requests`` (the first ``load.warmup_requests`` as warm-up) and return one record each
    (each one sent, when ``stop`` was set before the end). ``share``: this process runs one worker's
    part of a load split over several (workers.py)."""
    if not requests:
        raise ValueError("requests: nothing to send")
    if target.images_over_http and any(r.all_images for r in requests):
        from servetune.loadgen.image_server import ImageServer

        images = await ImageServer(target.image_host).start()
        try:
            return await run_load(target.model_copy(update={"images_over_http": False}), images.rewrite(requests),
                                  load, t0_ns=t0_ns, progress=progress, tokenizer=tokenizer, stop=stop, share=share)
        finally:
            await images.stop()
    if share is None and load.warmup_requests >= len(requests):
        raise ValueError(
            f"warmup_requests ({load.warmup_requests}) must be fewer than the requests ({len(requests)})"
        )
    count = token_counter(tokenizer)
    n_warm = load.warmup_requests
    warm = share.warm if share is not None else [i < n_warm for i in range(len(requests))]
    records = [r.new_record(warm[i]) for i, r in enumerate(requests)]
    bodies = [request_body(target, r) for r in requests]
    endpoint = target.endpoint
    key = target.api_key()
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream", "Accept-Encoding": "identity"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    timeout_s = target.timeout_s
    idle = IdleWatch(target.idle_timeout_s) if target.idle_timeout_s else None
    counters = [0, 0, 0]  # done, errors, output tokens
    sent = bytearray(len(requests))  # 1: dispatched (a stopped load keeps only these)
    clock = time.perf_counter_ns

    async def send(i: int, queue_ns: int, body: bytes | None = None, inline: bool = False) -> str | None:
        """Stream request i (``body``: its own, else the prebuilt one); ``inline``: decode it now and
        return its text (a session's turn), else leave it to the decoder task."""
        rec = records[i]
        rec.queue_ms = queue_ns / 1e6
        rec.payload_bytes = len(bodies[i] if body is None else body)
        sent[i] = 1
        reads = BoundedReads()
        times: list[int] = []
        t_send = clock()
        t_end = t_send
        try:
            async with asyncio.timeout(timeout_s) as deadline:
                reads.deadline = deadline
                if idle is not None:
                    idle.watch(i, t_send, times, deadline)
                status = await post(bodies[i] if body is None else body, times, reads,
                                    None if idle is None else (lambda: idle.alive(i)))
                t_end = clock()
                rec.http_status = status
                if status >= 400:
                    text = b"".join(reads)[:ERROR_BODY_BYTES].decode("utf-8", "replace")
                    reads.clear()
                    times.clear()
                    rec.error_class = _classify_status(status).value
                    rec.error_message = f"HTTP {status}: {text[:300]}"
        except TimeoutError:
            t_end = clock()
            if reads.over:
                rec.error_class, rec.error_message = ErrorClass.TOO_LARGE.value, reads.error_message()
                times.clear()
            elif idle is not None and i in idle.fired:
                rec.error_class = IDLE_TIMEOUT
                rec.error_message = (f"the stream sent no byte for {idle.silent_s(i):.1f} s "
                                     f"(idle_timeout_s={idle.idle_s:g}) after {len(times)} reads")
            else:
                rec.error_class = ErrorClass.TIMEOUT.value
                rec.error_message = f"no complete response within timeout_s={target.timeout_s}"
        except CONNECTION_ERRORS as exc:
            t_end = clock()
            rec.error_class = ErrorClass.CONNECTION.value
            rec.error_message = f"{type(exc).__name__}: {exc}"
        except asyncio.CancelledError:
            t_end = clock()
            rec.error_class = ErrorClass.CANCELLED.value
            rec.error_message = "cancelled while in flight"
            raise
        except Exception as exc:  # noqa: BLE001 - recorded on the request, never aborts the run
            t_end = clock()
            rec.error_class = ErrorClass.CLIENT.value
            rec.error_message = f"{type(exc).__name__}: {exc}"
        finally:
            if idle is not None:
                idle.forget(i)
            rec.t_send_s = (t_send - t0_ns) / 1e9
            rec.e2e_ms = (t_end - t_send) / 1e6
        text = decode(i, reads, times, t_send) if inline else None
        counters[0] += 1
        counters[1] += rec.error_class is not None
        counters[2] += len(times)  # an estimate until the stream is decoded: its chunks
        if progress is not None:
            progress(counters[0], counters[1], counters[2])
        if not inline:
            size = sum(map(len, reads))
            finished.append((i, reads, times, t_send, size))
            backlog[0] += size
            if backlog[0] > DECODE_BACKLOG_BYTES:
                wake.set()
        return text

    async def send_unit(u: int, queue_ns: int) -> None:
        """A request, or a session: each turn after the previous answer (and the user's think time),
        with the answers so far in its history; a failed turn ends the session."""
        unit = units[u]
        if not is_session(requests, unit):
            await send(unit[0], queue_ns)
            return
        answers: list[str] = []
        for k, i in enumerate(unit):
            req = requests[i]
            if k and req.think_s > 0:
                await asyncio.sleep(req.think_s)
            body = request_body(target, req.with_answers(answers)) if k else None
            text = await send(i, queue_ns if k == 0 else 0, body, inline=True)
            if records[i].error_class is not None:
                return
            answers.append(text or "")

    # Ended streams wait, undecoded, for the load to end. Past the backlog's bound one task decodes the
    # oldest, one stream per event-loop pass (so the sockets are still read between them), down to half.
    finished: collections.deque[tuple[int, list[bytes], list[int], int, int]] = collections.deque()
    backlog = [0]
    wake = asyncio.Event()

    async def decoder() -> None:
        while True:
            await wake.wait()
            wake.clear()
            while finished and backlog[0] > DECODE_BACKLOG_BYTES // 2:
                *item, size = finished.popleft()
                backlog[0] -= size
                decode(*item)
                await asyncio.sleep(0)

    def decode(i: int, reads: list[bytes], times: list[int], t_send: int) -> str:
        rec = records[i]
        text = ""
        try:
            if reads or rec.error_class is None:
                text = decode_stream(endpoint, reads, times, rec, t_send, count)
        except Exception as exc:  # noqa: BLE001
            rec.error_class = rec.error_class or ErrorClass.CLIENT.value
            rec.error_message = rec.error_message or f"decoding failed: {type(exc).__name__}: {exc}"
        if rec.error_message:
            rec.error_message = _redact(rec.error_message, key)
        return text

    async with open_transport(target, headers, load.concurrency) as transport:
        post = transport.post
        # The records and bodies are long-lived: keep the collector from re-scanning them all run long.
        gc.freeze()
        decoding = asyncio.create_task(decoder())
        watching = asyncio.create_task(idle.run()) if idle is not None else None
        lag = LoopLag()
        ticking = asyncio.create_task(lag.tick())
        try:
            # warm-up and measured requests are one load, without a pause between them: the warm-up
            # is the first requests of the same closed loop or arrival schedule (servetune.validity)
            # (a closed loop's streams and an open loop's arrivals are units: requests or sessions)
            units = load_units(requests)
            everything = list(range(len(units)))
            start = clock() if share is None else await share.start()  # workers: one shared start
            if start > clock():
                await asyncio.sleep((start - clock()) / 1e9)
            if load.mode == "rate":
                offsets = (share.offsets_s if share is not None and share.offsets_s is not None
                           else arrival_offsets_s(load, len(units), [requests[u[0]] for u in units]))
                dispatch = open_loop(everything, offsets, load.concurrency, send_unit, start_ns=start)
            elif load.mode == "waves":  # static batching: B units at once, the next B once all are done
                dispatch = waves(everything, load.concurrency, send_unit)
            else:
                dispatch = closed_loop(everything, load.concurrency, send_unit)
            stopped = await _until_stopped(dispatch, stop)
            drain_end = clock()
        finally:
            decoding.cancel()
            ticking.cancel()
            if watching is not None:
                watching.cancel()
            gc.unfreeze()
    while finished:  # the load is over: nothing to read any more
        *item, _ = finished.popleft()
        decode(*item)
    kept = [r for i, r in enumerate(records) if sent[i]]
    if progress is not None:  # exact now that every stream is decoded
        progress(len(kept), sum(r.error_class is not None for r in kept), sum(r.output_tokens or 0 for r in kept))
    measured = [r for r in kept if not r.warmup]
    first = min((r.t_send_s for r in measured), default=0.0)
    last = max((r.t_send_s for r in measured), default=0.0)
    lag_p99, lag_max = lag.over(first, last, t0_ns)
    return LoadOutcome(kept, first, last, (drain_end - t0_ns) / 1e9, stopped, lag_p99, lag_max, transport.name,
                       transport.arrival_stamps)


async def _until_stopped(dispatch: Coroutine[Any, Any, None], stop: asyncio.Event | None) -> bool:
    """Run the dispatcher to its end, or until ``stop`` is set: then cancel it (the requests in
    flight record themselves as cancelled) and return True."""
    if stop is None:
        await dispatch
        return False
    task = asyncio.ensure_future(dispatch)
    waiter = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        waiter.cancel()
    if task.done():
        task.result()  # a dispatcher's own error is raised, as without a stop
        return False
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        if asyncio.current_task().cancelling():  # type: ignore[union-attr]  # we were cancelled too
            raise
    return True


def run_load_sync(
    target: Target,
    requests: list[WorkloadRequest],
    load: LoadConfig,
    *,
    t0_ns: int | None = None,
    progress: Progress | None = None,
    tokenizer: Any = None,
) -> LoadOutcome:
    """run_load on a fresh event loop (uvloop when installed); ``t0_ns`` defaults to now."""
    try:
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        factory = None
    t0 = time.perf_counter_ns() if t0_ns is None else t0_ns
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(run_load(target, requests, load, t0_ns=t0, progress=progress, tokenizer=tokenizer))
