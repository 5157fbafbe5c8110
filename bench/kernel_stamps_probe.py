"""An experiment for bench/client_overhead.py (``--clients kernel-stamps``), not the load generator: a
closed loop that wakes once per millisecond, reads every ready socket and takes each read's arrival time
from the kernel (SO_TIMESTAMPNS: the receive time of the last segment the read consumed), so batching
wake-ups costs no timestamp accuracy while reads hold one chunk. It counts content chunks by their
``"text"`` key and parses nothing during the load, like the plain aiohttp loop it is compared with.

Usage (as a worker of the bench): python bench/kernel_stamps_probe.py URL STREAMS REQUESTS OUT [POLL_MS]
"""

from __future__ import annotations

import select
import socket
import struct
import sys
import time
from urllib.parse import urlsplit

import orjson

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux


def clock_offset_ns() -> int:
    """CLOCK_REALTIME (the kernel's stamps) minus perf_counter_ns, from the tightest of 20 brackets."""
    best: tuple[int, int] | None = None
    for _ in range(20):
        a, r, b = time.perf_counter_ns(), time.time_ns(), time.perf_counter_ns()
        if best is None or b - a < best[0]:
            best = (b - a, r - (a + b) // 2)
    return best[1]  # type: ignore[index]


def run(url: str, streams: int, n_requests: int, out: str, poll_ms: float = 1.0, tokens: int = 128) -> None:
    u = urlsplit(url)
    offset = clock_offset_ns()
    ep = select.epoll()
    ids = iter(range(n_requests + streams))  # the first request of each stream is its warm-up
    state: dict[int, dict] = {}
    socks: dict[int, socket.socket] = {}
    results: list[tuple[int, int, list[tuple[int, bytes]]]] = []

    def send(sock: socket.socket, i: int) -> None:
        body = orjson.dumps({"model": "m", "prompt": f"bench #{i}", "max_tokens": tokens, "stream": True})
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
                f"x-request-id: k-{i}\r\nContent-Length: {len(body)}\r\n\r\n")
        state[sock.fileno()].update(i=i, start=time.perf_counter_ns(), reads=[])
        sock.send(head.encode() + body)

    for _ in range(streams):
        s = socket.create_connection((u.hostname, u.port))
        s.setblocking(False)
        s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        socks[s.fileno()], state[s.fileno()] = s, {}
        ep.register(s.fileno(), select.EPOLLIN)
        send(s, next(ids))
    active, pause, unpack = streams, poll_ms / 1e3, struct.unpack
    while active:
        for fd, _ in ep.poll():
            s, st = socks[fd], state[fd]
            while True:
                try:
                    data, anc, _, _ = s.recvmsg(65536, 64)
                except BlockingIOError:
                    break
                if not data:
                    raise ConnectionError("the server closed a connection")
                t = time.perf_counter_ns()
                for _, kind, raw in anc:
                    if kind == SO_TIMESTAMPNS:
                        sec, nsec = unpack("qq", raw[:16])
                        t = sec * 1_000_000_000 + nsec - offset
                st["reads"].append((t, data))
                if data.endswith(b"\r\n0\r\n\r\n") or data == b"0\r\n\r\n":  # the last chunk: next request
                    if st["i"] >= streams:
                        results.append((st["i"], st["start"], st["reads"]))
                    i = next(ids, None)
                    if i is None:
                        ep.unregister(fd)
                        active -= 1
                    else:
                        send(s, i)
                    break
        time.sleep(pause)
    rows = [{"request_id": i, "start_ns": start, "chunk_ns": [t for t, d in reads for _ in range(d.count(b'"text"'))]}
            for i, start, reads in results]
    with open(out, "wb") as f:
        f.write(orjson.dumps({"plain": rows}))


if __name__ == "__main__":
    run(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5]) if len(sys.argv) > 5 else 1.0)
