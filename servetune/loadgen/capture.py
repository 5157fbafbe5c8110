"""The per-chunk hot path: stamp and keep each body chunk where the socket read delivers it.

Reading a stream through ``StreamReader.readany()`` costs a Future, a task wake-up and several
coroutine frames per chunk, and stamps the chunk only when the task runs (late, and with the
same time for chunks that queued up meanwhile). Instead the response's reader is switched to
``CaptureReader``, whose ``feed_data`` (called by aiohttp's HTTP parser inside the protocol's
``data_received``) appends ``perf_counter_ns()`` and the bytes to the request's lists; the
request task sleeps until end of stream. ``CaptureReader`` adds no state (``__slots__ = ()``),
so the switch is a plain ``__class__`` assignment; if aiohttp ever hands out a different reader
type, ``capture()`` says so and the caller falls back to ``readany()``.
"""

from __future__ import annotations

import time

from aiohttp import StreamReader

_clock = time.perf_counter_ns
_SINKS: dict[StreamReader, tuple[list[int], list[bytes]]] = {}


class CaptureReader(StreamReader):
    __slots__ = ()

    def feed_data(self, data: bytes, size: int = 0) -> bool:
        if data:
            times, reads = _SINKS[self]
            times.append(_clock())
            reads.append(data)
            self.total_bytes += len(data)
        return False

    # chunk boundaries only matter to readchunk(), which nobody calls on a captured stream
    def begin_http_chunk_receiving(self) -> None:
        pass

    def end_http_chunk_receiving(self) -> None:
        pass


def capture(reader: StreamReader, times: list[int], reads: list[bytes]) -> bool:
    """Route ``reader``'s future chunks into ``times``/``reads``; False if it cannot be captured.

    Bytes that arrived with the headers (already buffered) are moved over, stamped now.
    """
    if type(reader) is not StreamReader:
        return False
    if reader._buffer:  # noqa: SLF001 - see the module docstring
        t = _clock()
        for data in reader._buffer:  # noqa: SLF001
            times.append(t)
            reads.append(data)
        reader._buffer.clear()  # noqa: SLF001
        reader._size = 0  # noqa: SLF001
    _SINKS[reader] = (times, reads)
    reader.__class__ = CaptureReader
    return True


def release(reader: StreamReader) -> None:
    _SINKS.pop(reader, None)
