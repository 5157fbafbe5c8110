"""Server-sent events, split after the fact from raw, timestamped socket reads.

The hot path (client.py) only appends ``(perf_counter_ns(), bytes)`` per read; this module
turns those reads into events once the stream is over. Each event is stamped with the time
of the read that *completed* it: that is when the client could first have seen it.
The usual stream, one ``data:`` line per read as servers flush each token, skips the split:
``json_array`` rewrites the whole stream into one JSON array's text, and event i is read i.
"""

from __future__ import annotations

from itertools import accumulate, repeat
from typing import NamedTuple

_NEXT = b"\n\ndata: "
_DONE = b"data: [DONE]\n\n"


class SseEvent(NamedTuple):
    t_ns: int  # arrival of the read that completed the event
    event: bytes | None  # the ``event:`` field (b"error" for error events), None when absent
    data: bytes  # the ``data:`` lines joined by b"\n"


def json_array(reads: list[bytes]) -> tuple[bytes, int] | None:
    """``[d1,...,dk]`` of the data of every event before a final ``[DONE]``, and k, when each read is
    exactly one one-line ``data:`` event (so event i arrived with read i); None for any other stream.
    No raw newline can sit inside JSON, so counting them proves every newline is framing."""
    n = len(reads)
    if not n:
        return None
    blob = b"".join(reads) if n > 1 else reads[0]
    if (
        blob.count(b"\n") != 2 * n
        or blob.count(_NEXT) != n - 1
        or not blob.startswith(b"data: ")
        or b"\r" in blob
        or not all(map(bytes.endswith, reads, repeat(b"\n\n")))
    ):
        return None
    done = blob.endswith(b"\n\n" + _DONE)
    body = blob[6:-16] if done else blob[6:-2]
    if b"[DONE]" in body:  # [DONE] alone or before the end (or inside a text): the general path
        return None
    return b"[" + body.replace(_NEXT, b",") + b"]", n - done


def split_events(reads: list[bytes], times: list[int]) -> tuple[list[SseEvent], bytes]:
    """Split reads into events; returns the events and any trailing bytes that never formed one."""
    if not reads:
        return [], b""
    blob = b"".join(reads) if len(reads) > 1 else reads[0]
    if b"\r" in blob:  # CRLF framing (e.g. sse-starlette): rare, take the careful path
        return _split_incremental(reads, times)
    blocks = blob.split(b"\n\n")
    tail = blocks.pop().strip()
    read_ends = list(accumulate(map(len, reads)))
    events: list[SseEvent] = []
    append = events.append
    end = 0
    r = 0
    last = len(read_ends) - 1
    for block in blocks:
        end += len(block) + 2
        while r < last and read_ends[r] < end:  # the read that delivered this event's last byte
            r += 1
        if block.startswith(b"data: ") and b"\n" not in block:
            append(SseEvent(times[r], None, block[6:]))
        else:
            ev = _parse_block(block, 0, len(block), times[r])
            if ev is not None:
                append(ev)
    if tail:  # a last event the server did not terminate with a blank line
        ev = _parse_block(tail, 0, len(tail), times[-1])
        if ev is not None:
            events.append(ev)
            tail = b""
    return events, tail


def _split_incremental(reads: list[bytes], times: list[int]) -> tuple[list[SseEvent], bytes]:
    events: list[SseEvent] = []
    carry = b""
    for data, t in zip(reads, times, strict=True):
        buf = carry + data if carry else data
        held = b""
        if b"\r" in buf:
            if buf.endswith(b"\r"):  # maybe a CRLF split across reads: hold the CR for its LF
                buf, held = buf[:-1], b"\r"
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        start = 0
        while (end := buf.find(b"\n\n", start)) >= 0:
            ev = _parse_block(buf, start, end, t)
            if ev is not None:
                events.append(ev)
            start = end + 2
        carry = buf[start:] + held if held else buf[start:]
    tail = carry.strip()
    if tail and times:
        ev = _parse_block(tail, 0, len(tail), times[-1])
        if ev is not None:
            events.append(ev)
            tail = b""
    return events, tail


def _parse_block(buf: bytes, start: int, end: int, t: int) -> SseEvent | None:
    if buf.startswith(b"data: ", start) and buf.find(b"\n", start, end) < 0:
        return SseEvent(t, None, buf[start + 6 : end])  # the common case: one data line
    event: bytes | None = None
    data: list[bytes] = []
    for line in buf[start:end].split(b"\n"):
        if not line or line[0] == 58:  # b":" comment / keep-alive
            continue
        name, _, value = line.partition(b":")
        if value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            data.append(value)
        elif name == b"event":
            event = value
    if not data and event is None:
        return None
    return SseEvent(t, event, b"\n".join(data))
