"""Reading a pool's sockets in batched passes, each read stamped by the kernel.

A chunk stamped when the event loop gets to it is late by however busy the loop was. With
``SO_TIMESTAMPNS`` (Linux) each read carries the time the kernel received its last segment, so a chunk's
stamp no longer depends on when the client read it, and the client can read in batches: one wake-up
reads every socket that has data, instead of one wake-up (and often a context switch) per chunk.
The kernel stamps in CLOCK_REALTIME; the reader maps that onto ``perf_counter_ns`` (CLOCK_MONOTONIC, the
load's clock) with an offset it re-measures on every pass. A slew moves both clocks alike; a step (a clock
set by NTP or by a VM's host, seen as 0.5 ms jumps in a CI sandbox) moves only CLOCK_REALTIME, and a stamp
taken before it would map off by the step. So a pass that finds the offset moved (``STEP_NS``) stamps its
reads when it reads them and counts the step (``Reader.clock_steps``).
A read the kernel did not stamp (Linux turns receive stamps on a moment after the first socket asks, or a
step made its stamp ambiguous) is stamped when it is read, and counted (``Reader.unstamped``), so a result
can say its stamps were mixed.
"""

from __future__ import annotations

import asyncio
import select
import socket
import struct
import sys
import time
from typing import Any, Protocol

#: SO_TIMESTAMPNS on Linux's common ABIs (Python's socket module does not export it); elsewhere: none
SO_TIMESTAMPNS: int | None = getattr(socket, "SO_TIMESTAMPNS", 35 if sys.platform == "linux" else None)
ANCILLARY_BYTES = socket.CMSG_SPACE(16) if hasattr(socket, "CMSG_SPACE") else 0
READ_BYTES = 1 << 16
STEP_NS = 20_000  # the offset moved more than this between passes: CLOCK_REALTIME was stepped
BRACKET_NS = 20_000  # an offset read whose bracket is wider than this (the thread was preempted) is not used
_timespec = struct.Struct("@qq").unpack_from  # the ancillary data's first 16 bytes, no copy
_perf = time.perf_counter_ns


def enable(sock: socket.socket) -> bool:
    """Ask the kernel to stamp ``sock``'s reads; False where it cannot (then the reader stamps them)."""
    if SO_TIMESTAMPNS is None or not ANCILLARY_BYTES:
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


def realtime_offset_ns() -> int:
    """CLOCK_REALTIME minus perf_counter_ns, from the tighter of two brackets (within a microsecond)."""
    return _bracketed_offset()[0]


def _bracketed_offset() -> tuple[int, int]:
    """(offset, bracket width): the tighter of two reads of CLOCK_REALTIME between two of perf_counter_ns."""
    a, r, b = _perf(), time.time_ns(), _perf()
    c, r2, d = _perf(), time.time_ns(), _perf()
    return (r - (a + b) // 2, b - a) if b - a <= d - c else (r2 - (c + d) // 2, d - c)


class Readable(Protocol):
    closed: bool

    def recvmsg(self, bufsize: int, ancbufsize: int, /) -> tuple[bytes, list[tuple[int, int, bytes]], int, Any]: ...
    def received(self, data: bytes, t: int) -> None: ...
    def lost(self, exc: Exception | None) -> None: ...
    def fail(self, exc: Exception) -> None: ...


class Reader:
    """The event loop's one reader for a pool's connections: they sit in one epoll set, and a pass reads
    every socket that has data. A pass that would come less than ``batch_s`` after the previous one first
    sleeps out the rest, so under load one wake-up reads many chunks; when few arrive nothing waits.
    The tasks a pass's reads wake run right after it: a request that a stream's end lets out goes at most
    ``batch_s`` late (the stamps are not late). ``batch_s`` 0: a pass reads whatever is ready at once.
    Without epoll (not Linux) each socket is its own reader."""

    def __init__(self, batch_s: float = 0.0) -> None:
        self.batch_ns = int(batch_s * 1e9)
        self.passes = 0
        self.unstamped = 0  # reads that came without the kernel's stamp, or whose stamp a step made ambiguous
        self.clock_steps = 0  # passes that found CLOCK_REALTIME stepped since the one before
        self.offset_ns = realtime_offset_ns()
        self._trust = True  # False for one pass after a step: its stamps may be from either side of it
        self._last = 0
        self._conns: dict[int, Readable] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._epoll = select.epoll() if hasattr(select, "epoll") else None

    def add(self, fd: int, conn: Readable) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            if self._epoll is not None:
                self._loop.add_reader(self._epoll.fileno(), self._pass)
        self._conns[fd] = conn
        if self._epoll is not None:
            self._epoll.register(fd, select.EPOLLIN)
        else:
            self._loop.add_reader(fd, self._read_now, conn)

    def forget(self, fd: int) -> None:
        if self._conns.pop(fd, None) is None:
            return
        if self._epoll is not None:
            self._epoll.unregister(fd)
        elif self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(fd)

    def close(self) -> None:
        for fd in list(self._conns):
            self.forget(fd)
        if self._epoll is not None and not self._epoll.closed:  # closing twice is harmless
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._epoll.fileno())
            self._epoll.close()

    def _pass(self) -> None:
        wait = self._last + self.batch_ns - _perf()
        if wait > 0:
            time.sleep(wait / 1e9)
        self._last = _perf()
        self.passes += 1
        self._refresh()
        conns, read = self._conns, self._read
        for fd, _ in self._epoll.poll(0, len(conns) + 1):  # type: ignore[union-attr]
            conn = conns.get(fd)
            if conn is not None:
                read(conn)

    def _read_now(self, conn: Readable) -> None:
        self._refresh()
        self._read(conn)

    def _refresh(self) -> None:
        """Re-measure the offset (two clock reads, well under a microsecond); a jump means a step."""
        offset, width = _bracketed_offset()
        if width > BRACKET_NS:
            return  # preempted between the reads: keep the last offset rather than trust this one
        self._trust = abs(offset - self.offset_ns) <= STEP_NS
        if not self._trust:
            self.clock_steps += 1
        self.offset_ns = offset

    def _read(self, conn: Readable) -> None:
        """Read ``conn`` until a read comes back short (a large body fills several reads)."""
        offset, level_socket = self.offset_ns, socket.SOL_SOCKET
        kind_ns = SO_TIMESTAMPNS if self._trust else None  # after a step: stamped (and counted) as read
        while True:
            try:
                data, ancillary, _, _ = conn.recvmsg(READ_BYTES, ANCILLARY_BYTES)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                conn.lost(exc)
                return
            if not data:
                conn.lost(None)
                return
            now = t = _perf()
            for level, kind, raw in ancillary:
                if kind == kind_ns and level == level_socket and len(raw) >= 16:
                    sec, nsec = _timespec(raw)
                    t = min(now, sec * 1_000_000_000 + nsec - offset)  # never after the read itself
                    break
            else:
                self.unstamped += 1
            try:
                conn.received(data, t)
            except Exception as exc:  # noqa: BLE001 - a bug in one response fails that request, not the pass
                conn.fail(exc)
                return
            if len(data) < READ_BYTES or conn.closed:
                return
