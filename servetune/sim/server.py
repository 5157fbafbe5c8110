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
import time
import uuid
from collections import deque
from typing import Any

import numpy as np
import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from . import tokens as tk
from .args import SGLANG_VERSION_MODELLED, SimArgs
from .batch_log import BatchLog
from .metrics import SimMetrics
from .scheduler import RequestRejected, Scheduler, SimRequest

log = logging.getLogger("servetune.sim.server")

SPIN_S = 0.0012  # wake this much before the modelled time, then spin
LEAD_MAX_S = 0.002  # never emit more than this ahead of the modelled time
CATCH_UP_S = 0.002  # an engine later than this starts the next iteration "now" (lag is not carried)
DEFAULT_MAX_TOKENS = 128  # when a request gives no max_tokens (there is no EOS model)
ERROR_SAMPLES = 200_000
NO_KEY_PATHS = ("/health", "/health_generate", "/metrics", "/ready")


def _error(status: int, message: str, kind: str = "BadRequestError") -> web.Response:
    body = {"object": "error", "message": message, "type": kind, "param": None, "code": status}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


class _Stream:
    """One request's way out: streaming chunks written synchronously at emission time, or a future."""

    __slots__ = ("req", "kind", "transport", "pre", "post", "sent", "text", "done", "t_recv", "dead", "server",
                 "cached")

    def __init__(self, server: SimServer, req: SimRequest, kind: str, t_recv: float):
        self.server = server
        self.req = req
        self.kind = kind  # chat | completions | generate
        self.transport: asyncio.Transport | None = None  # set when streaming
        self.pre = b""
        self.post = b""
        self.sent = 0  # tokens written so far
        self.text = ""  # cumulative text (/generate streams it cumulatively, like SGLang)
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.t_recv = t_recv
        self.dead = False
        self.cached = 0

    def frame(self, count: int) -> bytes | None:
        """The chunk carrying tokens [sent, count), framed for chunked transfer; None if none to send.

        Built before the modelled time, so only the socket write is left for the emission instant.
        """
        if count <= self.sent or self.transport is None or self.dead:
            return None
        r = self.req
        new = tk.output_text(r.rid, self.sent, count)
        if self.kind == "generate":
            self.text += new
            payload = self.pre + orjson.dumps(self.text) + self.server.meta_bytes(self, count, None)
        else:
            payload = self.pre + orjson.dumps(new) + self.post
        self.sent = count
        return b"%x\r\n%s\r\n" % (len(payload), payload)


class SimServer:
    def __init__(self, args: SimArgs):
        self.args = args
        self.sched = Scheduler(args)
        self.metrics = SimMetrics(args, self.sched)
        self.batch_log = BatchLog(args, self.sched)
        self.streams: dict[int, _Stream] = {}
        self.errors: deque[float] = deque(maxlen=ERROR_SAMPLES)  # per token write: actual - modelled time
        self.wake_errors: deque[float] = deque(maxlen=ERROR_SAMPLES)  # per iteration: engine wake-up lateness
        self._next_rid = 0
        self._per_write = 5e-6  # running estimate of one socket write (s)
        self._wake: asyncio.Event | None = None
        self._engine: asyncio.Task[None] | None = None
        self.t0 = time.perf_counter()
        self.ready = False
        self.busy_s = 0.0  # modelled GPU-busy time so far (sum of iteration durations)
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
            it = sched.next_iteration(max(start, 0.0))
            if it is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            self.batch_log.on_iteration(it)
            self.busy_s += it.end - it.start
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

    # --- lifecycle ------------------------------------------------------------------------

    async def _on_startup(self, app: web.Application) -> None:
        self.t0 = time.perf_counter()
        self._wake = asyncio.Event()
        self._engine = asyncio.create_task(self._run_engine(), name="sim-engine")
        asyncio.get_running_loop().call_later(self.args.load_seconds, self._set_ready)

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
                }
            ],
        }
        return web.Response(body=orjson.dumps(info), content_type="application/json")

    async def sim_gpu(self, request: web.Request) -> web.Response:
        """The modelled GPUs right now, for servetune's simulated sampler (telemetry.simgpu): SGLang
        preallocates weights, KV pool and CUDA graphs, so memory is flat apart from prefill activations."""
        from .telemetry import gpu_static_bytes, activation_bytes

        a, g = self.args, self.args.gpu
        used = gpu_static_bytes(a) + activation_bytes(a, self.extend_tokens if self.sched.running else 0)
        return web.json_response({
            "t_model_s": self.now(), "busy_s": self.busy_s, "idle_w": g.idle_w, "tdp_w": g.tdp_w,
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

    # --- generation -----------------------------------------------------------------------

    def _submit(self, prompt: tk.Prompt, max_new: int, kind: str) -> _Stream | web.Response:
        rid = self._next_rid
        self._next_rid += 1
        req = SimRequest(rid=rid, tokens=prompt.ids, max_new=max_new, images=prompt.images)
        now = self.now()
        try:
            self.sched.add(req, now)
        except RequestRejected as exc:
            return _error(400, str(exc))
        st = _Stream(self, req, kind, now)
        self.streams[rid] = st
        assert self._wake is not None
        self._wake.set()
        return st

    async def _body(self, request: web.Request) -> dict[str, Any] | web.Response:
        if not self.ready:
            return _error(503, "The server is still loading the model.", "ServiceUnavailableError")
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            return _error(400, f"request body is not valid JSON: {exc}")
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object")
        return body

    @staticmethod
    def _max_tokens(body: dict[str, Any], *keys: str) -> int | web.Response:
        for k in keys:
            v = body.get(k)
            if v is not None:
                if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                    return _error(400, f"{k} must be a positive integer, got {v!r}")
                return v
        return DEFAULT_MAX_TOKENS

    def usage(self, st: _Stream) -> dict[str, Any]:
        r = st.req
        u: dict[str, Any] = {"prompt_tokens": r.plen, "completion_tokens": r.output_len,
                             "total_tokens": r.plen + r.output_len, "prompt_tokens_details": None}
        if self.args.enable_cache_report:
            u["prompt_tokens_details"] = {"cached_tokens": r.cached_tokens or 0}
        return u

    def meta(self, st: _Stream, count: int, finish: dict | None) -> dict[str, Any]:
        r = st.req
        return {"id": str(r.rid), "finish_reason": finish,
                "prompt_tokens": r.plen, "completion_tokens": count, "cached_tokens": r.cached_tokens or 0,
                "num_retractions": r.retractions}

    def meta_bytes(self, st: _Stream, count: int, finish: dict | None) -> bytes:
        return b',"meta_info":' + orjson.dumps(self.meta(st, count, finish)) + b',"index":0}\n\n'

    async def _finish_request(self, st: _Stream) -> None:
        try:
            await st.done
        finally:
            self.streams.pop(st.req.rid, None)
            if st.req.finished_at is not None:
                self.metrics.on_request_finished(st.req, st.t_recv, streaming=st.transport is not None)
            else:
                self.sched.abort(st.req)
                self.metrics.on_abort()

    async def _open_stream(self, request: web.Request, st: _Stream) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        writer = resp._payload_writer  # noqa: SLF001 - headers must be on the wire before raw chunks
        if writer is not None:
            writer.send_headers()
        st.transport = request.transport
        frame = st.frame(self.sched.output_len(st.req))  # tokens that came before the stream was open
        if frame is not None and st.transport is not None:
            st.transport.write(frame)
        return resp

    async def _write(self, resp: web.StreamResponse, data: bytes) -> None:
        try:
            await resp.write(data)
        except (ConnectionError, RuntimeError):
            pass

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _error(400, "messages must be a non-empty list")
        try:
            prompt = tk.chat_prompt(messages, self.args.model)
        except (ValueError, tk.BadImage) as exc:
            return _error(400, str(exc))
        return await self._openai(request, body, prompt, "chat", ("max_completion_tokens", "max_tokens"))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        prompt_text = body.get("prompt")
        if isinstance(prompt_text, list) and len(prompt_text) == 1 and isinstance(prompt_text[0], str):
            prompt_text = prompt_text[0]
        if not isinstance(prompt_text, str):
            return _error(400, "prompt must be a string (batched prompts are not simulated)")
        prompt = tk.text_prompt(prompt_text, (), self.args.model)
        return await self._openai(request, body, prompt, "completions", ("max_tokens",))

    async def _openai(self, request: web.Request, body: dict[str, Any], prompt: tk.Prompt, kind: str,
                      max_keys: tuple[str, ...]) -> web.StreamResponse:
        max_new = self._max_tokens(body, *max_keys)
        if isinstance(max_new, web.Response):
            return max_new
        st = self._submit(prompt, max_new, kind)
        if isinstance(st, web.Response):
            return st
        rid = f"{uuid.uuid4().hex}"
        created = int(time.time())
        model = body.get("model") or self.args.served_model_name
        chat = kind == "chat"
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = {"id": rid, "object": obj, "created": created, "model": model}
        head_b = orjson.dumps(head)[:-1]
        if not body.get("stream"):
            await self._finish_request(st)
            text = tk.output_text(st.req.rid, 0, st.req.output_len)
            choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                       "finish_reason": "length", "matched_stop": None} if chat else
                      {"index": 0, "text": text, "logprobs": None, "finish_reason": "length", "matched_stop": None})
            out = {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
                   "model": model, "choices": [choice], "usage": self.usage(st)}
            return web.Response(body=orjson.dumps(out), content_type="application/json")
        field = b'{"role":null,"content":' if chat else b""
        key = b'"delta":' if chat else b'"text":'
        st.pre = b"data: " + head_b + b',"choices":[{"index":0,' + key + field
        st.post = (b"}" if chat else b"") + b',"logprobs":null,"finish_reason":null}]}\n\n'
        resp = await self._open_stream(request, st)
        if chat:  # SGLang opens a chat stream with the role
            first = {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                          "logprobs": None, "finish_reason": None}]}
            await self._write(resp, b"data: " + orjson.dumps(first) + b"\n\n")
        try:
            await self._finish_request(st)
        except asyncio.CancelledError:
            raise
        last_choice = ({"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length", "matched_stop": None}
                       if chat else
                       {"index": 0, "text": "", "logprobs": None, "finish_reason": "length", "matched_stop": None})
        tail = b"data: " + orjson.dumps({**head, "choices": [last_choice]}) + b"\n\n"
        opts = body.get("stream_options") or {}
        if isinstance(opts, dict) and opts.get("include_usage"):
            tail += b"data: " + orjson.dumps({**head, "choices": [], "usage": self.usage(st)}) + b"\n\n"
        tail += b"data: [DONE]\n\n"
        await self._write(resp, tail)
        try:
            await resp.write_eof()
        except (ConnectionError, RuntimeError):
            pass
        return resp

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        sp = body.get("sampling_params") or {}
        if not isinstance(sp, dict):
            return _error(400, "sampling_params must be an object")
        max_new = self._max_tokens(sp, "max_new_tokens")
        if isinstance(max_new, web.Response):
            return max_new
        images = body.get("image_data") or []
        if isinstance(images, str):
            images = [images]
        try:
            if isinstance(body.get("input_ids"), list):
                prompt = tk.Prompt()
                prompt.ids.extend(int(x) for x in body["input_ids"])
            elif isinstance(body.get("text"), str):
                prompt = tk.text_prompt(body["text"], images, self.args.model)
            else:
                return _error(400, "either text (a string) or input_ids (a list) is required")
        except (ValueError, TypeError, tk.BadImage) as exc:
            return _error(400, str(exc))
        st = self._submit(prompt, max_new, "generate")
        if isinstance(st, web.Response):
            return st
        finish = {"type": "length", "length": max_new}
        if not body.get("stream"):
            await self._finish_request(st)
            out = {"text": tk.output_text(st.req.rid, 0, st.req.output_len),
                   "meta_info": self.meta(st, st.req.output_len, finish)}
            return web.Response(body=orjson.dumps(out), content_type="application/json")
        st.pre = b'data: {"text":'
        resp = await self._open_stream(request, st)
        await self._finish_request(st)
        final = {"text": st.text, "meta_info": self.meta(st, st.req.output_len, finish), "index": 0}
        await self._write(resp, b"data: " + orjson.dumps(final) + b"\n\ndata: [DONE]\n\n")
        try:
            await resp.write_eof()
        except (ConnectionError, RuntimeError):
            pass
        return resp


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
    runner = web.AppRunner(server.app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, a.host, a.port, backlog=1024)
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
