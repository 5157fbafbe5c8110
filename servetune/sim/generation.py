"""The generation endpoints of the simulated server (OpenAI chat/completions and SGLang /generate).

A mixin over ``SimServer``'s state (scheduler, streams, engine wake-up): requests are parsed,
submitted to the scheduler, and their streams opened; the engine task in servetune.sim.server
writes the tokens at their modelled times. Kept apart so each module has one job.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from . import tokens as tk
from .requests import RequestRejected, SimRequest

if TYPE_CHECKING:
    from .server import SimServer

DEFAULT_MAX_TOKENS = 128  # when a request gives no max_tokens (there is no EOS model)


def _error(status: int, message: str, kind: str = "BadRequestError") -> web.Response:
    body = {"object": "error", "message": message, "type": kind, "param": None, "code": status}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


class Stream:
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


class GenerationEndpoints:
    """Request handling of the simulated server; ``SimServer`` provides the state it reads."""


    def _submit(self, prompt: tk.Prompt, max_new: int, kind: str) -> Stream | web.Response:
        """Open the request's stream; it reaches the scheduler when the front end is done with it."""
        rid = self._next_rid
        self._next_rid += 1
        now = self.now()
        req = SimRequest(rid=rid, tokens=prompt.ids, max_new=max_new, images=prompt.images)
        try:
            self.sched.validate(req)
        except RequestRejected as exc:
            return _error(400, str(exc))
        st = Stream(self, req, kind, now)
        self.streams[rid] = st
        ready = self.frontend.ready_at(now, len(prompt.ids), prompt.pixels)
        if ready > now:
            loop = asyncio.get_running_loop()
            self._entering[rid] = loop.call_at(loop.time() + ready - now, self._enter, req, ready)
        else:
            self._enter(req, now)
        return st

    def _enter(self, req: SimRequest, t: float) -> None:
        """The front end hands ``req`` to the scheduler at modelled time ``t``."""
        self._entering.pop(req.rid, None)
        self.sched.add(req, t)
        assert self._wake is not None
        self._wake.set()

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

    def usage(self, st: Stream) -> dict[str, Any]:
        r = st.req
        u: dict[str, Any] = {"prompt_tokens": r.plen, "completion_tokens": r.output_len,
                             "total_tokens": r.plen + r.output_len, "prompt_tokens_details": None}
        if self.args.enable_cache_report:
            u["prompt_tokens_details"] = {"cached_tokens": r.cached_tokens or 0}
        return u

    def meta(self, st: Stream, count: int, finish: dict | None) -> dict[str, Any]:
        r = st.req
        return {"id": str(r.rid), "finish_reason": finish,
                "prompt_tokens": r.plen, "completion_tokens": count, "cached_tokens": r.cached_tokens or 0,
                "num_retractions": r.retractions}

    def meta_bytes(self, st: Stream, count: int, finish: dict | None) -> bytes:
        return b',"meta_info":' + orjson.dumps(self.meta(st, count, finish)) + b',"index":0}\n\n'

    async def _finish_request(self, st: Stream) -> None:
        try:
            await st.done
        finally:
            self.streams.pop(st.req.rid, None)
            if st.req.finished_at is not None:
                self.metrics.on_request_finished(st.req, st.t_recv, streaming=st.transport is not None)
            else:
                entering = self._entering.pop(st.req.rid, None)
                if entering is not None:  # the client left while its request was in the front end
                    entering.cancel()
                self.sched.abort(st.req)
                self.metrics.on_abort()

    async def _open_stream(self, request: web.Request, st: Stream) -> web.StreamResponse:
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
            from servetune.sim.remote_images import inline_remote_images  # images sent as http(s) URLs

            prompt = tk.chat_prompt(await inline_remote_images(messages), self.args.model)
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
