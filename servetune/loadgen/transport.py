"""How a load's requests reach the server: the raw HTTP/1.1 client (rawhttp.py; its reads stamped by the
kernel and read in batches, stamps.py) for ``http://`` targets, aiohttp for ``https://`` ones or when asked
(``Target.http_client``). Both give one call, ``post(body, times, reads, on_head)``: it returns the status
once the response is complete, with the body's reads and their arrival stamps in the caller's lists (an
error status's body too, for its message); ``arrival_stamps`` says who stamped them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Protocol

import aiohttp

from servetune.limits import ERROR_BODY_BYTES, MAX_SMALL_BYTES, ResponseTooLarge, read_body

from .capture import capture, release
from .config import Target
from .rawhttp import RawHttpPool

READ_BUFSIZE = 1 << 22  # 64 KiB (aiohttp's default) throttles long-context streams: vLLM #39963
PREFLIGHT_TIMEOUT_S = 10.0
#: what a failing connection raises, through either client (the request is recorded as a connection error)
CONNECTION_ERRORS = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, ConnectionError)


class TargetUnreachable(ConnectionError):
    """The target did not answer the preflight: nothing was sent. ``cause``: why, without the URL."""

    cause: str = ""


class Transport(Protocol):
    name: str
    arrival_stamps: str  # who stamped the chunks: "kernel" (each read's receive time), "client" or "mixed"

    async def post(self, body: bytes, times: list[int], reads: list[bytes],
                   on_head: Callable[[], None] | None) -> int: ...


def client_for(target: Target) -> str:
    """``raw`` or ``aiohttp``: the client ``target`` will be loaded through."""
    if target.http_client != "auto":
        return target.http_client
    return "raw" if target.url.startswith("http://") else "aiohttp"


class _Aiohttp:
    name = "aiohttp"
    arrival_stamps = "client"

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session, self.url = session, url

    async def post(self, body: bytes, times: list[int], reads: list[bytes],
                   on_head: Callable[[], None] | None) -> int:
        clock = time.perf_counter_ns
        async with self.session.post(self.url, data=body) as resp:
            if on_head is not None:
                on_head()
            content = resp.content
            if resp.status >= 400:
                reads.append(await content.read(ERROR_BODY_BYTES))
                times.append(clock())
            elif capture(content, times, reads):
                try:
                    await content.wait_eof()
                finally:
                    release(content)
            else:  # an aiohttp we do not know: the public, slower path
                readany = content.readany
                while data := await readany():
                    times.append(clock())
                    reads.append(data)
            return resp.status


def _unreachable(target: Target, exc: BaseException) -> TargetUnreachable:
    cause = str(exc) or type(exc).__name__
    unreachable = TargetUnreachable(f"target {target.url} is unreachable ({cause}); no request was sent")
    unreachable.cause = cause
    return unreachable


@contextlib.asynccontextmanager
async def open_transport(target: Target, headers: dict[str, str], streams: int) -> AsyncIterator[Transport]:
    """A transport to ``target``, after a preflight (any HTTP answer from ``/health`` proves it reachable;
    only transport failures raise ``TargetUnreachable``)."""
    timeout_s = min(PREFLIGHT_TIMEOUT_S, target.timeout_s)
    if client_for(target) == "raw":
        pool = RawHttpPool(target.url, target.request_path, headers, batch_s=target.read_batch_ms / 1e3)
        try:
            async with asyncio.timeout(timeout_s):
                await pool.get("/health")
        except (OSError, TimeoutError) as exc:
            pool.close()
            raise _unreachable(target, exc) from exc
        try:
            yield pool
        finally:
            pool.close()
        return
    connector = aiohttp.TCPConnector(limit=streams + 4, limit_per_host=0, keepalive_timeout=60)
    async with aiohttp.ClientSession(connector=connector, headers=headers, read_bufsize=READ_BUFSIZE,
                                     auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None)) as session:
        try:
            async with session.get(target.url + "/health", timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                await read_body(r, MAX_SMALL_BYTES, "GET /health")
        except (aiohttp.ClientConnectionError, TimeoutError, OSError, ResponseTooLarge) as exc:
            raise _unreachable(target, exc) from exc
        yield _Aiohttp(session, target.request_url)



async def check_reachable(target: Target) -> None:
    """The preflight alone: a trial asks before its load and again after it."""
    async with open_transport(target, {}, 1):
        pass
