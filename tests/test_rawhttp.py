"""The raw HTTP/1.1 client (servetune/loadgen/rawhttp.py) against a real TCP server that writes scripted bytes,
split wherever a read may end: the framing is removed exactly, keep-alive connections are reused, a connection
the server closed while idle is replaced, and every broken response fails the request with its reason."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from pydantic import ValidationError

from servetune.loadgen import Target
from servetune.loadgen.rawhttp import BadResponse, RawHttpPool, ServerDisconnected
from servetune.loadgen.transport import client_for

EVENTS = [b'data: {"n": %d}\n\n' % i for i in range(3)]
PAYLOAD = b"".join(EVENTS)
CHUNKED = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in EVENTS) + b"0\r\n\r\n"
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


class Scripted:
    """Answers each request on a connection with the next script: a list of byte pieces written with a
    pause between them (so they arrive as separate reads), then ``close`` or keep the connection."""

    def __init__(self, scripts: list[tuple[list[bytes], bool]]) -> None:
        self.scripts, self.connections, self.requests = list(scripts), 0, []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.scripts:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length")), 0)
                self.requests.append(head + await reader.readexactly(length))
                pieces, close = self.scripts.pop(0)
                for piece in pieces:
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0.005)
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def scripted(*scripts: tuple[list[bytes], bool]) -> AsyncIterator[tuple[Scripted, RawHttpPool]]:
    srv = Scripted(list(scripts))
    server = await asyncio.start_server(srv.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = RawHttpPool(f"http://127.0.0.1:{port}/gw", "/v1/completions", {"Accept": "text/event-stream"})
    try:
        yield srv, pool
    finally:
        pool.close()
        server.close()
        await server.wait_closed()


async def _post(pool: RawHttpPool, body: bytes = b'{"x": 1}') -> tuple[int, bytes, list[int]]:
    times: list[int] = []
    reads: list[bytes] = []
    status = await pool.post(body, times, reads)
    assert len(times) == len(reads) and times == sorted(times)
    return status, b"".join(reads), times


@pytest.mark.parametrize("cut", range(1, len(HEAD + CHUNKED)))
async def test_chunked_framing_is_removed_wherever_a_read_ends(cut: int) -> None:
    whole = HEAD + CHUNKED
    async with scripted(([whole[:cut], whole[cut:]], False)) as (srv, pool):
        status, payload, _ = await _post(pool)
    assert status == 200 and payload == PAYLOAD
    assert srv.requests[0].startswith(b"POST /gw/v1/completions HTTP/1.1\r\n")  # the base URL's path first
    assert b"Content-Length: 8\r\n" in srv.requests[0] and srv.requests[0].endswith(b'{"x": 1}')


async def test_each_chunk_is_stamped_when_it_arrives() -> None:
    pieces = [HEAD] + [b"%x\r\n%s\r\n" % (len(e), e) for e in EVENTS] + [b"0\r\n\r\n"]
    async with scripted((pieces, False)) as (_, pool):
        times, reads = [], []
        assert await pool.post(b"{}", times, reads) == 200
    assert reads == EVENTS  # one read per chunk, its framing gone
    gaps_ms = [(b - a) / 1e6 for a, b in zip(times, times[1:], strict=False)]
    assert all(g > 2 for g in gaps_ms), gaps_ms  # the server paused 5 ms between them


@pytest.mark.parametrize("response", [
    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(PAYLOAD), PAYLOAD),
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + CHUNKED[:-2] + b"X-Trailer: 1\r\n\r\n",
], ids=["content-length", "trailers"])
async def test_other_framings_and_keep_alive_reuse(response: bytes) -> None:
    async with scripted(([response[:40], response[40:]], False), ([response], False)) as (srv, pool):
        for _ in range(2):
            status, payload, _ = await _post(pool)
            assert status == 200 and payload == PAYLOAD
    assert srv.connections == 1  # the second request reused the first connection


async def test_a_body_delimited_by_the_close_and_http_1_0() -> None:
    async with scripted(([b"HTTP/1.0 200 OK\r\n\r\n", PAYLOAD], True), ([b"HTTP/1.1 204 No Content\r\n\r\n"], False)
                        ) as (srv, pool):
        assert (await _post(pool))[:2] == (200, PAYLOAD)
        assert (await _post(pool))[:2] == (204, b"")
    assert srv.connections == 2  # HTTP/1.0 without keep-alive: a new connection for the next request


async def test_a_connection_the_server_closed_while_idle_is_replaced() -> None:
    ok = HEAD + CHUNKED
    async with scripted(([ok], True), ([ok], False)) as (srv, pool):
        assert (await _post(pool))[:2] == (200, PAYLOAD)
        await asyncio.sleep(0.05)  # the server has closed it; the pool may or may not have noticed yet
        assert (await _post(pool))[:2] == (200, PAYLOAD)
    assert srv.connections == 2


async def test_a_reused_connection_that_fails_before_any_byte_is_retried_once_on_a_new_one() -> None:
    """The race the idle check cannot see: the server drops the kept connection as the request goes out."""
    ok = HEAD + CHUNKED
    async with scripted(([ok], False), ([], True), ([ok], False)) as (srv, pool):
        assert (await _post(pool))[:2] == (200, PAYLOAD)
        assert (await _post(pool))[:2] == (200, PAYLOAD)
    assert srv.connections == 2 and len(srv.requests) == 3  # sent on the kept connection, then on a new one


async def test_a_new_connection_that_fails_is_not_retried() -> None:
    async with scripted(([], True), ([HEAD + CHUNKED], False)) as (srv, pool):
        with pytest.raises(ServerDisconnected):
            await _post(pool)
    assert len(srv.requests) == 1


@pytest.mark.parametrize("pieces,error,match", [
    ([HEAD, CHUNKED[:20]], ServerDisconnected, "in the response's body"),
    ([], ServerDisconnected, "before the response's headers"),
    ([b"SSH-2.0-OpenSSH\r\n\r\n"], BadResponse, "not an HTTP/1.x response"),
    ([HEAD, b"zz\r\nhello\r\n"], BadResponse, "bad chunk size line"),
    ([b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 20000], BadResponse, "no end of headers"),
])
async def test_a_broken_response_fails_with_its_reason(pieces: list[bytes], error: type, match: str) -> None:
    async with scripted((pieces, True)) as (_, pool):
        with pytest.raises(error, match=match):
            await _post(pool)


async def test_an_error_status_keeps_its_body() -> None:
    body = b'{"error": "overloaded"}'
    async with scripted(([b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)],
                         False)) as (_, pool):
        assert (await _post(pool))[:2] == (503, body)


def test_the_client_is_chosen_by_scheme_and_can_be_pinned() -> None:
    assert client_for(Target(url="http://127.0.0.1:1")) == "raw"
    assert client_for(Target(url="https://gpu.example.com")) == "aiohttp"
    assert client_for(Target(url="http://127.0.0.1:1", http_client="aiohttp")) == "aiohttp"
    with pytest.raises(ValidationError, match="plain http:// only"):
        Target(url="https://gpu.example.com", http_client="raw")


@contextlib.asynccontextmanager
async def answering_at_once(response: bytes) -> AsyncIterator[tuple[list[int], RawHttpPool]]:
    """A server that answers as soon as it has a request's headers and never reads its body (a proxy
    refusing a huge upload); each connection's peer port is noted."""
    ports: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ports.append(writer.get_extra_info("peername")[1])
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(response)
            await writer.drain()
            await asyncio.sleep(30)  # holds the connection open, unread
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    pool = RawHttpPool(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", "/v1/completions", {})
    try:
        yield ports, pool
    finally:
        pool.close()
        server.close()


async def test_a_response_before_the_request_was_all_sent_ends_the_exchange_and_its_connection() -> None:
    """32 MiB the socket cannot take at once: the server's 413 ends the request at once, not when the
    unread rest times out, and the connection (its write half-done) is not reused."""
    refusal = b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 5\r\n\r\nlarge"
    async with answering_at_once(refusal) as (ports, pool):
        async with asyncio.timeout(5):
            for _ in range(2):
                status, payload, _ = await _post(pool, b"x" * (32 << 20))
                assert (status, payload) == (413, b"large")
    assert len(ports) == 2 and ports[0] != ports[1]


async def test_an_error_while_reading_fails_that_request_only_and_a_closed_pool_fails_its_waiting_ones() -> None:
    async with scripted(([HEAD + CHUNKED], False), ([HEAD + CHUNKED], False)) as (_, pool):
        def broken() -> None:
            raise RuntimeError("a bug in the head callback")

        async with asyncio.timeout(5):
            with pytest.raises(RuntimeError, match="head callback"):
                await pool.post(b"{}", [], [], broken)
            assert (await _post(pool))[:2] == (200, PAYLOAD)  # the next request, on a new connection
    async with answering_at_once(b"") as (_, pool):  # never answers
        waiting = asyncio.create_task(pool.post(b"{}", [], []))
        await asyncio.sleep(0.05)
        pool.close()
        async with asyncio.timeout(5):
            with pytest.raises(ConnectionAbortedError, match="pool was closed"):
                await waiting
