"""The real-time simulated SGLang server: SGLang's HTTP surface over the scheduler model.

One engine task steps the same clock-agnostic Scheduler the virtual driver uses: it forms an
iteration, sleeps until the iteration's modelled end (asyncio sleep to ~1 ms before, then a
short spin, because event-loop timers alone are late by a millisecond or more), and then writes
every stream's token chunk straight to its socket, so tokens leave at the modelled times. The
error of each write against its modelled time is kept and reported in ``/server_info``
(``internal_states[0].sim_emission_error_ms``) so the accuracy of the clock can be checked.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
import time
from collections import deque
from typing import Any

import numpy as np
import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from . import tokens as tk
from .args import SGLANG_VERSION_MODELLED, SimArgs
from .batch_log import BatchLog
from .frontend import FrontEnd
from .generation import GenerationEndpoints, Stream
from .metrics import SimMetrics
from .power import activity
from .scheduler import Scheduler

log = logging.getLogger("servetune.sim.server")

SPIN_S = 0.0012  # wake this much before the modelled time, then spin
LEAD_MAX_S = 0.002  # never emit more than this ahead of the modelled time
CATCH_UP_S = 0.002  # an engine later than this starts the next iteration "now" (its slip: lag is not carried)
ERROR_SAMPLES = 200_000
NO_KEY_PATHS = ("/health", "/health_generate", "/metrics", "/ready")


class SimServer(GenerationEndpoints):
    def __init__(self, args: SimArgs):
        self.args = args
        self.sched = Scheduler(args)
        self.frontend = FrontEnd.from_args(args)
        self._entering: dict[int, asyncio.TimerHandle] = {}  # requests in the front end, by rid
        self.metrics = SimMetrics(args, self.sched)
        self.batch_log = BatchLog(args, self.sched)
        self.streams: dict[int, Stream] = {}
        self.errors: deque[float] = deque(maxlen=ERROR_SAMPLES)  # per token write: actual - modelled time
        self.wake_errors: deque[float] = deque(maxlen=ERROR_SAMPLES)  # per iteration: engine wake-up lateness
        self.slips: deque[float] = deque(maxlen=ERROR_SAMPLES)  # per late start: how far the schedule moved
        self.slip_s = 0.0  # the schedule's total slip: modelled time a starved host added to every later token
        self._next_rid = 0
        self._per_write = 5e-6  # running estimate of one socket write (s)
        self._wake: asyncio.Event | None = None
        self._engine: asyncio.Task[None] | None = None
        self.t0 = time.perf_counter()
        self.ready = False
        self.busy_s = 0.0  # modelled GPU-busy time so far (sum of iteration durations)
        self.active_s = 0.0  # the same, each pass weighted by the share of dynamic power it draws (sim.power)
        self.extend_tokens = 0  # new tokens of the iteration in flight (activation memory)
        self.app = self._build_app()

    # --- clock ----------------------------------------------------------------------------

    def now(self) -> float:
        return time.perf_counter() - self.t0

    async def _sleep_until(self, t_model: float) -> None:
        target = self.t0 + t_model
        delay = target - time.perf_counter() - SPIN_S
        if delay > 0:
            await asyncio.sleep(delay)
        while time.perf_counter() < target:
            pass

    async def _run_engine(self) -> None:
        assert self._wake is not None
        sched = self.sched
        while True:
            if sched.idle:
                self._wake.clear()
                await self._wake.wait()
            now = self.now()
            start = sched.clock_end if now - sched.clock_end < CATCH_UP_S else now
            if start == now and (slip := now - self._could_start(sched)) > 0:
                self.slips.append(slip)
                self.slip_s += slip
            it = sched.next_iteration(max(start, 0.0))
            if it is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            self.batch_log.on_iteration(it)
            self.busy_s += it.end - it.start
            self.active_s += (it.end - it.start) * activity(self.args.gpu, it)
            self.extend_tokens = it.new_tokens
            # prepare every chunk now; at the modelled end only the socket writes remain
            streams = self.streams
            output_len = sched.output_len
            writes: list[tuple[asyncio.Transport, bytes]] = []
            for r in it.emitted:
                st = streams.get(r.rid)
                if st is not None:
                    frame = st.frame(output_len(r))
                    if frame is not None:
                        writes.append((st.transport, frame))  # type: ignore[arg-type]
            # centre the burst of writes on the modelled time (n writes take n x per_write)
            lead = min(len(writes) * self._per_write / 2, LEAD_MAX_S)
            await self._sleep_until(it.end - lead)
            t_abs = self.t0 + it.end
            clock = time.perf_counter
            w0 = clock()
            self.wake_errors.append(w0 + lead - t_abs)
            errors = self.errors
            for tr, frame in writes:
                if not tr.is_closing():
                    tr.write(frame)
                    errors.append(clock() - t_abs)
            if writes:
                self._per_write = 0.9 * self._per_write + 0.1 * (clock() - w0) / len(writes)
            for r in it.finished:
                st = streams.get(r.rid)
                if st is not None and not st.done.done():
                    st.done.set_result(None)

    @staticmethod
    def _could_start(sched: Scheduler) -> float:
        """When the modelled engine could have begun its next iteration: at the last one's end while it has work
        in hand, else when the first waiting request entered."""
        if sched.running or sched.chunked is not None or not sched.waiting:
            return sched.clock_end
        return max(sched.clock_end, min(r.arrival for r in sched.waiting))

    # --- lifecycle ------------------------------------------------------------------------

    async def _on_startup(self, app: web.Application) -> None:
        self.t0 = time.perf_counter()
        self._wake = asyncio.Event()
        self._engine = asyncio.create_task(self._run_engine(), name="sim-engine")
        self._log_start(self.args.load_seconds)
        asyncio.get_running_loop().call_later(self.args.load_seconds, self._set_ready)

    @staticmethod
    def _log_start(load_s: float) -> None:
        """SGLang's start lines (servetune.telemetry.startup_log reads them), ``load_s`` shared as a real start's
        logged time was: an 8B model on an H100, SGLang 0.5.17 (weights 2%, prefill graphs 61%, decode 4%)."""
        log.info("Load weight begin. (simulated)")
        log.info("Load weight end. elapsed=%.3f s, (simulated)", 0.02 * load_s)
        log.info("Memory pool end. (simulated)")
        log.info("Capture target prefill CUDA graph end. elapsed=%.3f s, (simulated)", 0.61 * load_s)
        log.info("Capture target decode CUDA graph end. elapsed=%.3f s, (simulated)", 0.04 * load_s)

    def _set_ready(self) -> None:
        self.ready = True
        log.info("The server is fired up and ready to roll! (simulated SGLang %s)", SGLANG_VERSION_MODELLED)

    async def _on_cleanup(self, app: web.Application) -> None:
        if self._engine is not None:
            self._engine.cancel()
            try:
                await self._engine
            except asyncio.CancelledError:
                pass
        for st in self.streams.values():
            if not st.done.done():
                st.done.cancel()

    def _build_app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth_middleware], client_max_size=256 * 1024 * 1024)
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/ready", self.health)
        r.add_get("/health_generate", self.health_generate)
        r.add_get("/server_info", self.server_info)
        r.add_get("/get_server_info", self.server_info)
        r.add_get("/model_info", self.model_info)
        r.add_get("/get_model_info", self.model_info)
        r.add_get("/v1/models", self.models)
        r.add_route("*", "/flush_cache", self.flush_cache)
        r.add_get("/metrics", self.metrics_endpoint)
        r.add_get("/sim/gpu", self.sim_gpu)
        r.add_post("/v1/chat/completions", self.chat)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/generate", self.generate)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    @web.middleware
    async def _auth_middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        key = self.args.api_key
        if key and request.method != "OPTIONS" and not request.path.startswith(NO_KEY_PATHS):
            if request.headers.get("Authorization", "") != f"Bearer {key}":
                return web.Response(status=401, body=orjson.dumps({"error": "Unauthorized"}),
                                    content_type="application/json")
        return await handler(request)

    # --- info endpoints -------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.ready else 503)

    async def health_generate(self, request: web.Request) -> web.Response:
        """Like SGLang: a one-token generation through the scheduler must complete."""
        if not self.ready:
            return web.Response(status=503)
        st = self._submit(tk.text_prompt("health", (), self.args.model), 1, "generate")
        if isinstance(st, web.Response):
            return web.Response(status=503)
        try:
            await asyncio.wait_for(asyncio.shield(st.done), timeout=20)
        except TimeoutError:
            return web.Response(status=503)
        finally:
            self.streams.pop(st.req.rid, None)
        return web.Response(status=200)

    def emission_error_ms(self, errors: deque[float] | None = None) -> dict[str, Any]:
        errors = self.errors if errors is None else errors
        if not errors:
            return {"count": 0}
        arr = np.abs(np.fromiter(errors, float)) * 1000.0
        p50, p99 = np.percentile(arr, [50, 99])
        return {"count": int(arr.size), "p50": float(p50), "p99": float(p99), "max": float(arr.max()),
                "mean": float(arr.mean())}

    async def server_info(self, request: web.Request) -> web.Response:
        a, sc = self.args, self.sched
        info = {
            **a.server_args(),
            "max_total_num_tokens": a.max_total_num_tokens,
            "version": SGLANG_VERSION_MODELLED,
            "simulated": True,
            "internal_states": [
                {
                    "effective_max_running_requests_per_dp": a.max_running_requests,
                    "last_gen_throughput": sc.last_decode_rate,
                    "memory_usage": {
                        "weight": a.weight_bytes_per_rank / 2**30,
                        "kvcache": a.kv_pool_bytes_per_rank / 2**30,
                        "token_capacity": a.max_total_num_tokens,
                    },
                    "num_running_reqs": len(sc.running),
                    "num_queue_reqs": sc.num_queue(),
                    "sim_emission_error_ms": self.emission_error_ms(),
                    "sim_wake_error_ms": self.emission_error_ms(self.wake_errors),
                    "sim_slip_ms": self.emission_error_ms(self.slips) | {"total": self.slip_s * 1e3},
                }
            ],
        }
        return web.Response(body=orjson.dumps(info), content_type="application/json")

    async def sim_gpu(self, request: web.Request) -> web.Response:
        """The modelled GPUs right now, for servetune's simulated sampler (telemetry.simgpu): SGLang
        preallocates weights, KV pool and CUDA graphs, so memory is flat apart from prefill activations."""
        from .telemetry import activation_bytes, gpu_static_bytes

        a, g = self.args, self.args.gpu
        used = gpu_static_bytes(a) + activation_bytes(a, self.extend_tokens if self.sched.running else 0)
        return web.json_response({
            "t_model_s": self.now(), "busy_s": self.busy_s, "active_s": self.active_s,
            "idle_w": g.idle_w, "tdp_w": g.tdp_w,
            "devices": [{"index": r, "name": f"{g.name} (simulated)", "uuid": f"SIM-{g.name}-{r}",
                         "mem_total": a.gpu_memory_bytes, "mem_used": used} for r in range(a.tp_size)],
        })

    async def model_info(self, request: web.Request) -> web.Response:
        a = self.args
        return web.json_response({
            "model_path": a.model_path,
            "tokenizer_path": a.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": a.model.vision is not None,
            "model_type": a.model_profile,
            "simulated": True,
        })

    async def models(self, request: web.Request) -> web.Response:
        a = self.args
        return web.json_response({"object": "list", "data": [
            {"id": a.served_model_name, "object": "model", "created": int(time.time()), "owned_by": "sglang",
             "root": a.served_model_name, "max_model_len": a.context_length}]})

    async def flush_cache(self, request: web.Request) -> web.Response:
        if self.sched.flush_cache():
            return web.Response(text="Cache flushed.\nPlease check backend logs for more details. (When there are "
                                     "running or waiting requests, the operation will not be performed.)\n")
        return web.Response(status=400, text="Cache not flushed. Please check backend logs for more details. "
                                             "(When there are running or waiting requests, the operation will "
                                             "not be performed.)\n")

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        if not self.args.enable_metrics:
            return web.Response(status=404, text="404: Not Found")
        return web.Response(body=self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def serve(args: SimArgs) -> None:
    """Run until SIGINT/SIGTERM; binds ``args.host:args.port`` (127.0.0.1:30000 by default)."""
    server = SimServer(args)
    a = args
    log.info(
        "Simulated SGLang (a model, not a measurement): model_profile=%s gpu_profile=%s tp_size=%d",
        a.model_profile, a.gpu_profile, a.tp_size,
    )
    log.info(
        "max_total_num_tokens=%d, chunked_prefill_size=%d, max_prefill_tokens=%d, max_running_requests=%d, "
        "context_len=%d, available_gpu_mem=%.2f GB",
        a.max_total_num_tokens, a.chunked_prefill_size, a.max_prefill_tokens, a.max_running_requests,
        a.context_length, (a.gpu_memory_bytes * (1 - a.mem_fraction_static)) / 2**30,
    )
    # bound before the app starts: a taken port fails here, before the "ready" line a waiter would believe
    family = socket.AF_INET6 if ":" in a.host else socket.AF_INET
    sock = socket.create_server((a.host, a.port), family=family, backlog=1024)
    runner = web.AppRunner(server.app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.SockSite(runner, sock)
    await site.start()
    log.info("Uvicorn running on http://%s:%d (simulated)", a.host, a.port)
    gc.collect()
    gc.freeze()  # start-up objects leave the collector's view: shorter GC pauses on the emission path
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def run(args: SimArgs) -> None:
    """Blocking entry point (uvloop when available)."""
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(serve(args))
