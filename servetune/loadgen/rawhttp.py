"""The streaming hot path's HTTP/1.1 client: one non-blocking socket per keep-alive connection.

Through aiohttp a body chunk costs several Python calls (its protocol's ``data_received``, the parser's
callbacks, the stream reader; capture.py trims these to one override, and they remain the client's main
CPU cost at hundreds of streams). Here a chunk costs one call: read it with the kernel's receive stamp
(stamps.py), strip the chunked framing, append the payload. The socket is the loop's reader directly
(``add_reader``), not a transport, because a transport drops the ancillary data the stamp comes in.
A load POSTs prebuilt bodies with fixed headers to one host, which is all this client does; plain
``http://`` only (an https target goes through aiohttp, transport.py). A reused connection that the
server closed while it sat idle fails before any byte comes back: that request is retried once on a
fresh connection, as urllib3 does; any other failure ends the request.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from servetune.limits import ERROR_BODY_BYTES, MAX_SMALL_BYTES

from . import stamps
from .bounded import BoundedReads

_clock = time.perf_counter_ns
MAX_HEAD_BYTES = 1 << 16


class ServerDisconnected(ConnectionError):
    """The server closed the connection before its response was complete."""


class BadResponse(ConnectionError):
    """What came back is not an HTTP/1.x response this client can read."""


class _Connection:
    """One connection: ``exchange()`` writes a request and resolves with the status once the response is
    complete; the body's payload lands in the caller's ``reads``, stamped in ``times``."""

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop, reader: stamps.Reader) -> None:
        self.sock, self.loop, self.reader = sock, loop, reader
        self.fd = sock.fileno()
        self.recvmsg = sock.recvmsg
        self.closed = False
        self.done: asyncio.Future[int] | None = None
        self.unsent: memoryview | None = None  # the rest of a request the socket did not take at once
        self._begin([], [], None)
        reader.add(self.fd, self)

    def _begin(self, times: list[int], reads: list[bytes], on_head: Callable[[], None] | None) -> None:
        self.times, self.reads, self.on_head = times, reads, on_head
        self.head = b""
        self.in_body = False
        self.got_bytes = False
        self.status = 0
        self.keep_alive = True
        self.chunked = False
        self.last_chunk = False
        self.left = -1  # Content-Length bytes still to come; -1: the body runs until the server closes
        self.skip = 0  # chunked: the current chunk's payload still to come, plus its CRLF
        self.partial = b""  # chunked: a size line (or the last chunk's CRLF) split across reads

    async def exchange(self, request: bytes, times: list[int], reads: list[bytes],
                       on_head: Callable[[], None] | None) -> int:
        assert not self.closed and self.done is None
        self._begin(times, reads, on_head)
        done = self.done = self.loop.create_future()
        try:
            sent = self.sock.send(request)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self.lost(exc)
            return await done
        if sent < len(request):  # the rest as the socket drains; our own writer, so close() can drop it
            self.unsent = memoryview(request)[sent:]
            self.loop.add_writer(self.fd, self._send_rest)
        return await done

    def _send_rest(self) -> None:
        try:
            sent = self.sock.send(self.unsent)  # type: ignore[arg-type]
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.lost(exc)
            return
        self.unsent = self.unsent[sent:]  # type: ignore[index]
        if not self.unsent:
            self._stop_sending()

    def _stop_sending(self) -> None:
        if self.unsent is not None:
            self.unsent = None
            if not self.loop.is_closed():
                self.loop.remove_writer(self.fd)

    def lost(self, exc: Exception | None) -> None:
        """The connection ended (the server closed it, or it broke): fail or finish its exchange."""
        self.close()
        if self.done is None or self.done.done():
            return
        if self.in_body and not self.chunked and self.left < 0:  # a body delimited by the close
            self._finish()
            return
        where = "in the response's body" if self.in_body else "before the response's headers"
        self.fail(ServerDisconnected(f"the server closed the connection {where}" + (f": {exc}" if exc else "")))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._stop_sending()  # before the fd is closed and its number given to another socket
        self.reader.forget(self.fd)
        self.sock.close()

    # --- the hot path -------------------------------------------------------------------------
    def received(self, data: bytes, t: int) -> None:
        if self.in_body:
            if self.chunked:
                self._chunks(data, t)
            else:
                self._plain(data, t)
            if self.status >= 400:
                self._enough_of_an_error()
            return
        if self.done is None:  # bytes between responses: nothing can be trusted on this connection
            self.close()
            return
        self.got_bytes = True
        head = self.head + data if self.head else data
        end = head.find(b"\r\n\r\n")
        if end < 0:
            self.head = head
            if len(head) > MAX_HEAD_BYTES:
                self.fail(BadResponse(f"no end of headers in the first {len(head)} bytes"))
            return
        try:
            self._read_head(head[:end])
        except ValueError as exc:
            self.fail(BadResponse(f"not an HTTP/1.x response ({exc})"))
            return
        self.in_body, self.head = True, b""
        if self.on_head is not None:
            self.on_head()
        if self.left == 0:
            self._finish()
        elif len(head) > end + 4:
            rest = head[end + 4:]
            self._chunks(rest, t) if self.chunked else self._plain(rest, t)
        if self.status >= 400:
            self._enough_of_an_error()

    def _enough_of_an_error(self) -> None:
        """An error's body is read up to ERROR_BODY_BYTES (what the record keeps), then the exchange ends and
        the connection closes: a server that sends an error without end costs the client nothing more."""
        if self.done is not None and sum(map(len, self.reads)) >= ERROR_BODY_BYTES:
            self.keep_alive = False
            self._finish()

    def _plain(self, data: bytes, t: int) -> None:
        if self.left >= 0:
            if len(data) > self.left:
                data = data[: self.left]
            self.left -= len(data)
        self.times.append(t)
        self.reads.append(data)
        if self.left == 0:
            self._finish()

    def _chunks(self, data: bytes, t: int) -> None:
        if not (self.skip or self.partial or self.last_chunk):  # the usual read: exactly one whole chunk
            eol = data.find(b"\r\n", 0, 10)
            if eol > 0:
                try:
                    size = int(data[:eol], 16)
                except ValueError:  # a chunk extension: the general path below
                    size = 0
                if size and len(data) == eol + size + 4:
                    self.times.append(t)
                    self.reads.append(data[eol + 2 : -2])
                    return
        if self.partial:
            data, self.partial = self.partial + data, b""
        n, pos, skip = len(data), 0, self.skip
        while pos < n:
            if skip:  # inside a chunk: its payload, then the CRLF that closes it
                take = min(skip, n - pos)
                pay = min(take, skip - 2)
                if pay > 0:
                    self.times.append(t)
                    self.reads.append(data if pay == n else data[pos : pos + pay])
                pos += take
                skip -= take
                continue
            if self.last_chunk:  # after the zero-size chunk: no trailers, or trailers up to a blank line
                tail = data[pos:]
                if tail.startswith(b"\r\n") or b"\r\n\r\n" in tail:
                    self.skip = 0
                    self._finish()
                else:
                    self.partial = tail
                return
            eol = data.find(b"\r\n", pos)
            if eol < 0:
                self.partial = data[pos:]
                break
            try:
                size = int(data[pos:eol].split(b";", 1)[0], 16)
            except ValueError:
                self.fail(BadResponse(f"bad chunk size line {data[pos:eol][:40]!r}"))
                return
            pos = eol + 2
            if size == 0:
                self.last_chunk = True
            else:
                skip = size + 2
        self.skip = skip

    def _read_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        version, _, rest = lines[0].partition(b" ")
        if not version.startswith(b"HTTP/1.") or len(rest) < 3:
            raise ValueError(f"status line {lines[0][:60]!r}")
        self.status = int(rest[:3])
        self.keep_alive = version == b"HTTP/1.1"
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == b"content-length":
                self.left = int(value)
            elif name == b"transfer-encoding":
                self.chunked = value.endswith(b"chunked")
            elif name == b"connection":
                self.keep_alive = (b"close" not in value) and (self.keep_alive or b"keep-alive" in value)
        if self.chunked:
            self.left = -1
        elif self.status in (204, 304) or self.status < 200:
            self.left = 0
        if self.left < 0 and not self.chunked:
            self.keep_alive = False  # the body ends when the server closes

    def _finish(self) -> None:
        done, self.done = self.done, None
        self.in_body = False
        if not self.keep_alive or self.unsent is not None:  # answered before the request was all sent
            self.close()
        if done is not None and not done.done():
            done.set_result(self.status)

    def fail(self, exc: Exception) -> None:
        """The exchange fails with ``exc`` (a broken response, an error while reading it, a closed pool)."""
        done, self.done = self.done, None
        self.close()
        if done is not None and not done.done():
            done.set_exception(exc)


class RawHttpPool:
    """Keep-alive connections to one ``http://`` base URL; ``post()`` streams one request's response to
    ``path`` under it (the base URL's own path, e.g. a gateway's prefix, comes first)."""

    name = "raw"  # a loadgen transport (transport.py)

    def __init__(self, base_url: str, path: str, headers: dict[str, str], batch_s: float = 0.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"the raw HTTP client speaks plain http:// only, not {base_url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self._base_path = parts.path.rstrip("/")
        lines = [f"POST {self._base_path}{path} HTTP/1.1", f"Host: {parts.netloc}",
                 *(f"{k}: {v}" for k, v in headers.items())]
        self._post_head = ("\r\n".join(lines) + "\r\nContent-Length: ").encode("latin-1")
        self._netloc = parts.netloc
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()
        self._addresses: list[tuple] = []
        self.reader = stamps.Reader(batch_s)
        self.kernel_stamps: bool | None = None  # True: the kernel stamps every connection's reads
        self._unstamped_before_load = 0  # the preflight's reads may come before Linux turns stamps on

    @property
    def arrival_stamps(self) -> str:
        """Who stamped the chunks' arrivals since the preflight: ``kernel`` (each read's receive time),
        ``client`` (when the loop read it), or ``mixed`` (the kernel, but some reads came without its stamp)."""
        if not self.kernel_stamps:
            return "client"
        return "mixed" if self.reader.unstamped > self._unstamped_before_load else "kernel"

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        if not self._addresses:
            self._addresses = list(await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM))
        error: OSError | None = None
        for family, kind, proto, _, address in self._addresses:
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                kernel = stamps.enable(sock)
                await loop.sock_connect(sock, address)
            except OSError as exc:
                sock.close()
                error = exc
                continue
            except BaseException:
                sock.close()
                raise
            self.kernel_stamps = kernel and self.kernel_stamps is not False
            if not self.kernel_stamps:
                self.reader.batch_ns = 0  # the reader stamps the reads: batching them would stamp them late
            conn = _Connection(sock, loop, self.reader)
            self._open.add(conn)
            return conn
        raise error or OSError(f"no address for {self.host}:{self.port}")

    async def _exchange(self, request: bytes, times: list[int], reads: list[bytes],
                        on_head: Callable[[], None] | None) -> int:
        while True:
            reused = bool(self._idle)
            conn = self._idle.pop() if reused else await self._connect()
            if conn.closed:
                self._open.discard(conn)
                if reused:  # the server closed it while it sat idle
                    continue
                raise ServerDisconnected("the server closed the connection as soon as it was opened")
            try:
                status = await conn.exchange(request, times, reads, on_head)
            except ServerDisconnected:
                self._open.discard(conn)
                if reused and not conn.got_bytes:
                    continue  # dropped by the server as the request went out: another connection
                raise
            except BaseException:
                self._drop(conn)
                raise
            self._keep(conn)
            return status

    async def post(self, body: bytes, times: list[int], reads: list[bytes],
                   on_head: Callable[[], None] | None = None) -> int:
        """POST ``body``; returns the status once the response is complete, its payload in ``reads``."""
        return await self._exchange(b"%s%d\r\n\r\n%s" % (self._post_head, len(body), body), times, reads, on_head)

    async def get(self, path: str) -> int:
        """GET ``path`` under the base URL (the preflight): the status."""
        request = f"GET {self._base_path}{path} HTTP/1.1\r\nHost: {self._netloc}\r\n\r\n".encode("latin-1")
        try:
            return await self._exchange(request, [], BoundedReads(MAX_SMALL_BYTES), None)  # what it says is not read
        finally:
            self._unstamped_before_load = self.reader.unstamped

    def _keep(self, conn: _Connection) -> None:
        if conn.closed:
            self._open.discard(conn)
        else:
            self._idle.append(conn)

    def _drop(self, conn: _Connection) -> None:
        conn.close()
        self._open.discard(conn)

    def close(self) -> None:
        for conn in self._open:  # a request still waiting on one fails, rather than wait on a dead socket
            conn.fail(ConnectionAbortedError("the client's connection pool was closed"))
        self._open.clear()
        self._idle.clear()
        self.reader.close()
