"""Kernel receive stamps and batched reads (servetune/loadgen/stamps.py, the raw client's reader) on real
loopback TCP sockets, and what the load generator builds on them: a stamp that does not move when the event
loop is late, passes bounded by the batch interval, and streams decoded after the load unless they pile up."""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from collections.abc import Iterator

import numpy as np
import pytest

from servetune.loadgen import LoadConfig, Target, client as client_module, run_load, stamps
from sse_server import Scenario, ServerProcess, SseServer
from test_loadgen import _requests

linux = pytest.mark.skipif(sys.platform != "linux", reason="SO_TIMESTAMPNS is Linux's")


class Socket:
    """A client socket as the reader sees a connection: what it read, each with its stamp."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.closed = sock, False
        self.recvmsg = sock.recvmsg
        self.got: list[tuple[bytes, int]] = []
        self.ended = asyncio.Event()

    def received(self, data: bytes, t: int) -> None:
        self.got.append((data, t))

    def lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.ended.set()


def _pairs(n: int, kernel: bool = True) -> Iterator[tuple[socket.socket, socket.socket]]:
    """n connected loopback TCP pairs (client non-blocking, stamped by the kernel if ``kernel``)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        for _ in range(n):
            c = socket.create_connection(listener.getsockname())
            s, _ = listener.accept()
            for x in (c, s):
                x.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            c.setblocking(False)
            assert stamps.enable(c) if kernel else True
            yield c, s


def _wrap(pairs: list[tuple[socket.socket, socket.socket]], reader: stamps.Reader) -> list[Socket]:
    conns = [Socket(c) for c, _ in pairs]
    for conn in conns:
        reader.add(conn.sock.fileno(), conn)
    return conns


async def _warm(pairs: list[tuple[socket.socket, socket.socket]], conns: list[Socket], reader: stamps.Reader) -> None:
    """A first round trip on every socket: Linux turns receive stamps on a moment after the first socket asks
    (the reader stamps and counts what comes before); then the count starts from zero."""
    for _, server in pairs:
        server.send(b"warm;")
    async with asyncio.timeout(5):
        while not all(c.got for c in conns):
            await asyncio.sleep(0.001)
    for c in conns:
        c.got.clear()
    reader.unstamped = 0


def _close(pairs: list[tuple[socket.socket, socket.socket]], reader: stamps.Reader) -> None:
    reader.close()
    for c, s in pairs:
        c.close()
        s.close()


async def _blocked_loop_reads(
        reader: stamps.Reader) -> tuple[int, int, list[tuple[bytes, int]], list[tuple[bytes, int]]]:
    """One segment to a stamped and an unstamped socket while the loop is blocked for 50 ms: (before, after, the
    stamped socket's reads, the unstamped one's)."""
    pairs = list(_pairs(1)) + list(_pairs(1, kernel=False))
    stamped, unstamped = _wrap(pairs, reader)
    try:
        await _warm(pairs, [stamped, unstamped], reader)
        reader.clock_steps = 0
        before = time.perf_counter_ns()
        for _, server in pairs:
            server.send(b"data: 1\n\n")
        after = time.perf_counter_ns()
        time.sleep(0.05)  # the event loop is busy elsewhere for 50 ms
        async with asyncio.timeout(5):
            while not (stamped.got and unstamped.got):
                await asyncio.sleep(0.001)
    finally:
        _close(pairs, reader)
    return before, after, stamped.got, unstamped.got


@linux
async def test_a_kernel_stamp_stays_on_the_arrival_while_the_loop_is_blocked() -> None:
    for _ in range(3):  # a run in which the host stepped CLOCK_REALTIME judges nothing (the next test covers it)
        reader = stamps.Reader()
        before, after, got, got_late = await _blocked_loop_reads(reader)
        if reader.clock_steps == 0:
            break
    assert reader.clock_steps == 0, "CLOCK_REALTIME stepped in each of three runs"
    (data, t), (_, t_late) = got[0], got_late[0]
    assert data == b"data: 1\n\n"
    assert before - 50_000 <= t <= after + 50_000, (t - before, after - t)  # on the send (clock offset: us)
    assert t_late - after >= 50_000_000  # without the kernel's stamp: when the loop got to it
    assert reader.unstamped == 1  # that one read, counted


@linux
async def test_a_clock_step_before_a_pass_stamps_its_reads_as_read_and_counts_them(monkeypatch) -> None:
    """CLOCK_REALTIME set 0.5 ms ahead while the loop is blocked (as a VM's host or NTP does): the kernel's stamp
    of the waiting segment would map 0.5 ms before its send; the pass sees the step and stamps it as read."""
    measure = stamps._bracketed_offset
    reader = stamps.Reader()
    real_sleep = time.sleep

    def step_while_blocked(s: float) -> None:
        real_sleep(s)
        monkeypatch.setattr(stamps, "_bracketed_offset", lambda: (measure()[0] + 500_000, 0))

    monkeypatch.setattr(time, "sleep", step_while_blocked)
    before, after, got, _ = await _blocked_loop_reads(reader)
    monkeypatch.undo()
    (_, t) = got[0]
    assert reader.clock_steps == 1
    assert t - after >= 50_000_000  # stamped when the loop read it, not 0.5 ms before its send
    assert reader.unstamped == 2  # that read and the unstamped socket's, counted


@linux
async def test_batched_passes_are_bounded_and_every_stamp_is_a_segments_arrival() -> None:
    """Eight streams, a segment on each every 1 ms; the reader passes at most once per 10 ms, so a read holds
    several segments, and its stamp is when the last of them arrived: between that send's before and after."""
    reader = stamps.Reader(batch_s=0.010)
    pairs = list(_pairs(8))
    conns = _wrap(pairs, reader)
    sends: list[list[tuple[int, int]]] = [[] for _ in pairs]

    def write() -> None:
        for k in range(40):
            for j, (_, server) in enumerate(pairs):
                before = time.perf_counter_ns()
                server.send(b"%d;" % k)
                sends[j].append((before, time.perf_counter_ns()))
            time.sleep(0.001)

    try:
        await _warm(pairs, conns, reader)
        passes, start = reader.passes, time.perf_counter_ns()
        await asyncio.to_thread(write)
        async with asyncio.timeout(5):
            while sum(c.got[-1][0].endswith(b"39;") for c in conns if c.got) < len(conns):
                await asyncio.sleep(0.001)
        elapsed_ms = (time.perf_counter_ns() - start) / 1e6
    finally:
        _close(pairs, reader)
    assert reader.passes - passes <= elapsed_ms / 10 + 3, (reader.passes - passes, elapsed_ms)
    assert reader.unstamped == 0
    reads = 0
    for conn, sent in zip(conns, sends, strict=True):
        assert b"".join(d for d, _ in conn.got) == b"".join(b"%d;" % k for k in range(40))  # nothing lost
        assert [t for _, t in conn.got] == sorted(t for _, t in conn.got)
        count = 0
        for data, t in conn.got:
            count += data.count(b";")
            before, after = sent[count - 1]  # the read ends with segment count-1: its stamp is that one's
            assert before - 50_000 <= t <= after + 50_000, (before - t, t - after)
        reads += len(conn.got)
    # batched: a pass reads a socket once, all that came since, and the passes are bounded by the interval
    # (above); how many segments a read carries then depends only on how fast this machine wrote them
    assert reads <= (reader.passes - passes) * len(conns), (reads, reader.passes - passes)


@pytest.mark.parametrize("batch_ms", [0.0, 1.0])
async def test_a_load_stamps_its_chunks_on_the_servers_send_times_though_its_loop_stalls(
        tmp_path, batch_ms: float) -> None:
    """The server in its own process logs each write; the client's loop stalls 2 ms at every stream end (a
    slow progress callback), so a chunk that arrives meanwhile is read late. Its stamp is not: every chunk's
    arrival comes after the server's stamp taken right before its write and, but for the kernel's delivery
    (tenths of a millisecond), before the one taken right after it (read when the loop got to it: up to 2 ms
    later). A busy host may hold the write after its first stamp; the second one bounds that. Chunks read
    together share the last one's stamp: all but the last of such a run are left out (counted)."""
    with ServerProcess(Scenario(ttft_ms=10, gap_ms=5), tmp_path) as srv:
        t0 = time.perf_counter_ns()
        out = await run_load(Target(url=srv.url, read_batch_ms=batch_ms), _requests(16, out=8),
                             LoadConfig(concurrency=4), t0_ns=t0, progress=lambda *_: time.sleep(0.002))
    log = srv.log()
    assert out.arrival_stamps == ("kernel" if sys.platform == "linux" else "client")
    early, late, merged = [], [], 0
    for rec in out.records:
        assert rec.ok and len(rec.chunk_offsets_ms) == 8 and rec.completion_tokens == 8
        begun = np.asarray(log[rec.request_id]["chunk_ns"], dtype=np.float64)
        ended = np.asarray(log[rec.request_id]["chunk_end_ns"], dtype=np.float64)
        at = t0 + rec.t_send_s * 1e9 + np.asarray(rec.chunk_offsets_ms) * 1e6
        alone = np.append(np.diff(at) != 0, True)  # a chunk whose stamp the next one does not share
        merged += int((~alone).sum())
        early.extend((at - begun)[alone] / 1e6)
        late.extend((at - ended)[alone] / 1e6)
    assert min(early) > -0.05  # never before the write began (the clocks' offset: microseconds)
    if sys.platform == "linux":  # stamped by the kernel as it delivers, soon after the write returned
        assert np.percentile(late, 90) < 0.3, (np.percentile(late, [50, 90, 99]), merged)
    assert merged < len(out.records) * 8 / 2  # most chunks were read one by one
    with pytest.raises(ValueError, match="read_batch_ms"):
        Target(url=srv.url, read_batch_ms=5)


@pytest.mark.parametrize("bound", [client_module.DECODE_BACKLOG_BYTES, 1])
async def test_streams_are_decoded_after_the_load_unless_their_backlog_passes_its_bound(
        monkeypatch, bound: int) -> None:
    """Decoding waits for the load's end (its CPU stays out of the measured window); past the bound on the
    undecoded bytes (1 byte here) the decoder works during the load. Either way the records are whole, and
    the last progress report has the exact token count."""
    monkeypatch.setattr(client_module, "DECODE_BACKLOG_BYTES", bound)
    decoded_at: list[int] = []
    real = client_module.decode_stream

    def timed(*args, **kw):  # noqa: ANN002, ANN003, ANN202 - the real decode, its time noted
        decoded_at.append(time.perf_counter_ns())
        return real(*args, **kw)

    monkeypatch.setattr(client_module, "decode_stream", timed)
    reports: list[tuple[int, int, int]] = []
    async with SseServer(Scenario(ttft_ms=2, gap_ms=2, tokens_per_chunk=2, shape="usage_chunk")) as srv:
        t0 = time.perf_counter_ns()
        out = await run_load(Target(url=srv.url), _requests(24, out=8), LoadConfig(concurrency=4), t0_ns=t0,
                             progress=lambda *a: reports.append(a))
    last_send = t0 + max(r.t_send_s for r in out.records) * 1e9
    during = sum(t < last_send for t in decoded_at)
    assert len(decoded_at) == 24 and (during == 0 if bound > 1 else during >= 12), during
    assert all(r.ok and r.completion_tokens == 8 and r.chunk_tokens == [2, 2, 2, 2] for r in out.records)
    assert reports[-1] == (24, 0, 24 * 8)  # exact, once every stream is decoded
    assert [r[0] for r in reports[:-1]] == list(range(1, 25))  # one per stream end, counted as it ended
