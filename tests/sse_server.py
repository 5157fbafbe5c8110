"""A real streaming HTTP server (aiohttp) that emits tokens on a known schedule and logs its sends.

It speaks the three endpoints the load generator uses (OpenAI chat/completions in every stream
shape we have seen, SGLang /generate with cumulative text) and can fail on request. Each send
is stamped with ``perf_counter_ns`` right before the write, so a client on the same machine
can be judged against what the server actually did, not against sleep targets.

One ticker task writes every due chunk (a heap of streams ordered by due time) instead of one
sleeping task per stream: that is what lets it feed 1,000 streams on one core for bench/.

A request picks a behaviour by tags in its prompt: ``#17`` names it (the key of the send log)
and ``[fail:reset]`` etc. select a failure (see ``FAILURES``); a client whose prompts we do not
write (``servetune bench``) gets one by arrival order instead (``Scenario.fail_nth``). ``stall_mid``
goes silent after ``fail_after_chunks`` chunks, ``keepalive`` sends only SSE comments from there.

Run standalone (bench/client_overhead.py does): ``python tests/sse_server.py --port 0 --ready-file F
--log-file L`` prints nothing, writes the bound URL to F, and dumps the send log to L on SIGTERM.
One process feeds about 90k chunks/s; for more (1,024 streams at 5 ms is 205k), several processes share one
port (``--reuse-port``: the kernel spreads connections over them) and each counts its chunks into its own
slot of a shared file (``--counter-file``/``--counter-slot``), which a benchmark sums without asking any.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import itertools
import mmap
import os
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from aiohttp import web

from sse_process import ServerProcess  # noqa: F401  (re-exported: this module in its own process)

SHAPES = ("usage_chunk", "usage_in_last", "usage_every", "no_usage")
FAILURES = ("400", "500", "503", "stall", "stall_mid", "keepalive", "reset", "malformed", "error_event",
            "empty", "endless")
_ID = re.compile(r"#(\d+)")
_FAIL = re.compile(r"\[fail:(\w+)\]")
_TRAILING_INT = re.compile(r"(\d+)$")  # peers' x-request-id headers, e.g. vLLM's "bench-1a2b-17"


@dataclass
class Scenario:
    ttft_ms: float = 20.0  # request received -> first content chunk
    gap_ms: float = 5.0  # between content chunks
    tokens_per_chunk: int = 1
    shape: str = "usage_chunk"  # OpenAI stream shape, see SHAPES
    role_chunk: bool = True  # chat: an empty role-only chunk at once (must not count as TTFT)
    cached_tokens: int = 3
    fail_after_chunks: int = 2  # reset/malformed/error_event/stall_mid happen after this many content chunks
    fail_nth: dict[int, str] = field(default_factory=dict)  # POST arrival (0-based) -> failure


@dataclass
class SendLog:
    """What the server did for one request (perf_counter_ns)."""

    t_recv_ns: int
    chunk_ns: list[int] = field(default_factory=list)  # content chunk writes (stamped right before each)
    chunk_end_ns: list[int] = field(default_factory=list)  # ... and right after each returned
    end_ns: int | None = None  # after the stream's end was written: no byte of it arrives later
    chunk_tokens: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    authorization: str | None = None
    body: dict | None = None


@dataclass(eq=False)
class _Stream:
    resp: web.StreamResponse
    endpoint: str
    log: SendLog
    total: int  # tokens to send
    fail: str | None
    done: asyncio.Future
    sent: int = 0  # tokens sent so far
    n_chunks: int = 0
    text: str = ""  # cumulative text (/generate)


class SseServer:
    def __init__(self, scenario: Scenario | None = None, host: str = "127.0.0.1") -> None:
        self.scenario = scenario or Scenario()
        self.host = host
        self.log: dict[int, SendLog] = {}
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._heap: list[tuple[int, int, _Stream]] = []
        self._seq = itertools.count()
        self._wake: asyncio.Event | None = None
        self._ticker: asyncio.Task | None = None
        self._closing: asyncio.Event | None = None
        self.posts = 0  # generation requests received
        self.endless_bytes = 0  # what the "endless" failure wrote
        self.counter: memoryview | None = None  # sent chunks: one int64 slot of a shared file (use_counter)
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        for path, endpoint in (
            ("/v1/chat/completions", "chat"),
            ("/v1/completions", "completions"),
            ("/generate", "generate"),
        ):
            app.router.add_post(path, self._handler(endpoint))
        self.app = app

    # --- lifecycle ---
    def use_counter(self, path: Path, slot: int) -> None:
        """Also count sent chunks into int64 slot ``slot`` of ``path`` (a file others map and sum)."""
        with path.open("r+b") as f:
            self._mmap = mmap.mmap(f.fileno(), 0)
        self.counter = memoryview(self._mmap).cast("q")[slot : slot + 1]

    async def start(self, port: int = 0, reuse_port: bool = False) -> str:
        self._wake, self._closing = asyncio.Event(), asyncio.Event()
        self._ticker = asyncio.create_task(self._tick())
        self._runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, port, backlog=4096, reuse_port=reuse_port or None)
        await site.start()
        bound = self._runner.addresses[0][1]
        self.url = f"http://{self.host}:{bound}"
        return self.url

    async def stop(self) -> None:
        if self._closing is not None:
            self._closing.set()
        if self._ticker is not None:
            self._ticker.cancel()
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> SseServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- HTTP ---
    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "sse-test", "object": "model"}]})

    def _handler(self, endpoint: str):
        async def handle(request: web.Request) -> web.StreamResponse:
            t_recv = time.perf_counter_ns()
            body = orjson.loads(await request.read())
            prompt = _prompt_of(body, endpoint)
            m = _TRAILING_INT.search(request.headers.get("x-request-id", "")) or _ID.search(prompt)
            rid = int(m.group(1)) if m else -next(self._seq) - 1
            fm = _FAIL.search(prompt)
            fail = fm.group(1) if fm else self.scenario.fail_nth.get(self.posts)
            self.posts += 1
            total = int(
                body["sampling_params"]["max_new_tokens"] if endpoint == "generate" else body["max_tokens"]
            )
            log = SendLog(
                t_recv, prompt_tokens=len(prompt.split()), authorization=request.headers.get("Authorization")
            )
            log.body = body
            self.log[rid] = log
            if fail in ("400", "500", "503"):
                return web.json_response({"error": {"message": f"scheduled {fail}"}}, status=int(fail))
            if fail in ("endless_error", "endless_headers"):  # an error body, or the headers, without end
                return await self._endless_before_body(request, fail)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            if endpoint == "chat" and self.scenario.role_chunk:
                await resp.write(_event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}))
            if fail == "stall":  # headers sent, then nothing until the client gives up
                await self._closing.wait()  # type: ignore[union-attr]
                return resp
            if fail in ("endless", "endless_event", "deep_json"):  # see _endless
                await self._endless(resp, fail)
                return resp
            stream = _Stream(resp, endpoint, log, total, fail, asyncio.get_running_loop().create_future())
            due = t_recv + int(self.scenario.ttft_ms * 1e6)
            heapq.heappush(self._heap, (due, next(self._seq), stream))
            self._wake.set()  # type: ignore[union-attr]
            try:
                ending = await stream.done
            except ConnectionError:
                return resp
            if ending == "reset":
                request.transport.abort()  # type: ignore[union-attr]
                return resp
            if ending in ("stall_mid", "keepalive"):  # silent (or comments only) until the client gives up
                await self._hold(resp, ending == "keepalive")
                return resp
            await resp.write_eof()
            log.end_ns = time.perf_counter_ns()
            return resp

        return handle

    # --- the schedule ---
    async def _tick(self) -> None:
        heap, clock, gap = self._heap, time.perf_counter_ns, int(self.scenario.gap_ms * 1e6)
        while True:
            if not heap:
                self._wake.clear()  # type: ignore[union-attr]
                await self._wake.wait()  # type: ignore[union-attr]
                continue
            now = clock()
            while heap and heap[0][0] <= now:
                _, seq, s = heapq.heappop(heap)
                try:
                    finished = await self._send_next(s)
                except ConnectionError as exc:
                    if not s.done.done():
                        s.done.set_exception(exc)
                    continue
                if not finished:
                    heapq.heappush(heap, (now + gap, seq, s))
            if heap:
                await asyncio.sleep(max(0, heap[0][0] - clock()) / 1e9)

    async def _endless(self, resp: web.StreamResponse, how: str = "endless") -> None:
        """Until the client hangs up, 1 MiB a write: ``endless`` one `data:` line without end; ``endless_event``
        short `data:` lines that never close their event (no blank line); ``deep_json`` one event whose JSON
        opens arrays without end."""
        if how == "endless_event":
            head, block = b"", b"data: xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\n" * 14_000
        else:
            head = b"data: " + (b"[" if how == "deep_json" else b'{"choices": [{"index": 0, "delta": {"content": "')
            block = (b"[" if how == "deep_json" else b"x") * (1 << 20)
        try:
            await resp.write(head)
            while not self._closing.is_set():  # type: ignore[union-attr]
                await resp.write(block)
                self.endless_bytes += len(block)
        except (ConnectionError, RuntimeError):  # the client hung up (aiohttp raises either)
            pass

    async def _endless_before_body(self, request: web.Request, how: str) -> web.StreamResponse:
        """``endless_error``: HTTP 500 with a JSON error body without end; ``endless_headers``: a 200 whose
        headers never end (64-byte header lines, 1 MiB a write), written on the raw transport."""
        if how == "endless_error":
            resp = web.StreamResponse(status=500, headers={"Content-Type": "application/json"})
            await resp.prepare(request)
            await self._endless(resp)
            return resp
        transport = request.transport
        assert transport is not None
        line = b"X-Pad: " + b"p" * 55 + b"\r\n"
        block = line * ((1 << 20) // len(line))
        transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n")
        while not self._closing.is_set() and not transport.is_closing():  # type: ignore[union-attr]
            if transport.get_write_buffer_size() > 4 << 20:  # the client reads no faster: wait, never buffer
                await asyncio.sleep(0.01)
                continue
            transport.write(block)
            self.endless_bytes += len(block)
            await asyncio.sleep(0)
        raise asyncio.CancelledError  # the response was written by hand: aiohttp must not add one

    async def _hold(self, resp: web.StreamResponse, comments: bool) -> None:
        """Keep the stream open with no data until the client leaves or the server stops."""
        closing: asyncio.Event = self._closing  # type: ignore[assignment]
        while not closing.is_set():
            if comments:
                try:
                    await resp.write(b": keep-alive\n\n")
                except ConnectionError:
                    return
            try:
                await asyncio.wait_for(closing.wait(), self.scenario.gap_ms / 1e3)
            except TimeoutError:
                pass

    async def _send_next(self, s: _Stream) -> bool:
        """Write the next content chunk (and the trailer after the last); True when the stream ended."""
        sc = self.scenario
        fails_here = ("reset", "malformed", "error_event", "stall_mid", "keepalive")
        if s.fail in fails_here and s.n_chunks == sc.fail_after_chunks:
            if s.fail == "malformed":
                await s.resp.write(b'data: {"choices": [{"delta": {"content": "tr\n\n')
            elif s.fail == "error_event":
                await s.resp.write(_event({"error": {"message": "scheduled error event", "code": 500}}))
            s.done.set_result(s.fail)
            return True
        if s.fail == "empty":
            await self._write_trailer(s)
            s.done.set_result("ok")
            return True
        k = min(sc.tokens_per_chunk, s.total - s.sent)
        s.sent += k
        s.n_chunks += 1
        last = s.sent >= s.total
        text = "tok " * k
        frame = self._content_frame(s, text, last)
        s.log.chunk_ns.append(time.perf_counter_ns())
        s.log.chunk_tokens.append(k)
        if self.counter is not None:
            self.counter[0] += 1
        await s.resp.write(frame)
        s.log.chunk_end_ns.append(time.perf_counter_ns())
        if last:
            s.log.completion_tokens = s.sent
            await self._write_trailer(s)
            s.done.set_result("ok")
        return last

    def _usage(self, s: _Stream) -> dict:
        return {
            "prompt_tokens": s.log.prompt_tokens,
            "completion_tokens": s.sent,
            "total_tokens": s.log.prompt_tokens + s.sent,
            "prompt_tokens_details": {"cached_tokens": self.scenario.cached_tokens},
        }

    def _content_frame(self, s: _Stream, text: str, last: bool) -> bytes:
        finish = "length" if last else None
        if s.endpoint == "generate":
            s.text += text
            meta = {
                "prompt_tokens": s.log.prompt_tokens,
                "completion_tokens": s.sent,
                "cached_tokens": self.scenario.cached_tokens,
                "finish_reason": {"type": "length"} if last else None,
            }
            return _event({"text": s.text, "meta_info": meta})
        choice = (
            {"index": 0, "delta": {"content": text}, "finish_reason": finish}
            if s.endpoint == "chat"
            else {"index": 0, "text": text, "finish_reason": finish}
        )
        obj: dict = {"id": "cmpl-sse", "object": "chunk", "choices": [choice]}
        shape = self.scenario.shape
        if shape == "usage_every" or (shape == "usage_in_last" and last):
            obj["usage"] = self._usage(s)
        return _event(obj)

    async def _write_trailer(self, s: _Stream) -> None:
        shape = self.scenario.shape
        if s.endpoint == "generate":
            await s.resp.write(b"data: [DONE]\n\n")
            return
        if shape == "usage_chunk":
            await s.resp.write(_event({"id": "cmpl-sse", "choices": [], "usage": self._usage(s)}))
        if shape != "usage_in_last":
            await s.resp.write(b"data: [DONE]\n\n")


def _event(obj: dict) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _prompt_of(body: dict, endpoint: str) -> str:
    if endpoint == "generate":
        return body["text"]
    if endpoint == "completions":
        return body["prompt"]
    parts = []
    for msg in body["messages"]:
        content = msg["content"]
        parts.append(content if isinstance(content, str) else " ".join(p.get("text", "") for p in content))
    return "\n".join(parts)


def realtime(priority: int) -> bool:
    """Best effort SCHED_FIFO for the calling thread, so a shared machine's other tenants
    cannot delay the sends (the truth we judge clients against); False when not permitted."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
        return True
    except (OSError, AttributeError):
        return False


def dump_log(log: dict[int, SendLog], path: Path) -> None:
    rows = {
        str(rid): {"t_recv_ns": lg.t_recv_ns, "chunk_ns": lg.chunk_ns, "chunk_end_ns": lg.chunk_end_ns,
                   "chunk_tokens": lg.chunk_tokens}
        for rid, lg in log.items()
    }
    path.write_bytes(orjson.dumps(rows))


async def _serve(args: argparse.Namespace) -> None:
    scenario = Scenario(
        ttft_ms=args.ttft_ms, gap_ms=args.gap_ms, tokens_per_chunk=args.tokens_per_chunk, shape=args.shape
    )
    server = SseServer(scenario)
    if args.counter_file:
        server.use_counter(Path(args.counter_file), args.counter_slot)
    url = await server.start(args.port, reuse_port=args.reuse_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    Path(args.ready_file).write_text(url)
    await stop.wait()
    await server.stop()
    if args.log_file:
        dump_log(server.log, Path(args.log_file))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ttft-ms", type=float, default=20.0)
    p.add_argument("--gap-ms", type=float, default=5.0)
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    p.add_argument("--shape", choices=SHAPES, default="usage_chunk")
    p.add_argument("--ready-file", required=True, help="the bound URL is written here once listening")
    p.add_argument("--log-file", help="send log (JSON) written here on SIGTERM")
    p.add_argument("--rt-priority", type=int, default=0, help="SCHED_FIFO priority when permitted (0: normal)")
    p.add_argument("--reuse-port", action="store_true", help="SO_REUSEPORT: other processes may serve this port")
    p.add_argument("--counter-file", help="count sent chunks into an int64 slot of this (existing) file")
    p.add_argument("--counter-slot", type=int, default=0)
    args = p.parse_args()
    if args.rt_priority:
        realtime(args.rt_priority)
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(_serve(args))


if __name__ == "__main__":
    main()
