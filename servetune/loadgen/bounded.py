"""A response's bytes, bounded: an engine that streams without end cannot take the client's memory.

Both transports append a response's reads to the list the client hands them; this list counts what it
holds and, past ``limit`` bytes, keeps no more and makes the request's own ``asyncio.timeout`` due now, so
the request ends the way a timeout does and ``over`` tells the two apart (the idle watch does the same).
The limit bounds a line, an event and a body at once: none of them can outgrow the response.
"""

from __future__ import annotations

import asyncio

from servetune import limits
from servetune.limits import mib


class BoundedReads(list[bytes]):
    """The reads of one response; ``deadline`` (the request's timeout) is made due once ``limit`` is passed."""

    __slots__ = ("size", "limit", "over", "deadline")

    def __init__(self, limit: int | None = None) -> None:
        super().__init__()
        self.size, self.over = 0, False
        self.limit = limits.MAX_RESPONSE_BYTES if limit is None else limit  # read now: a test may lower it
        self.deadline: asyncio.Timeout | None = None

    def append(self, data: bytes) -> None:
        if self.over:
            return
        self.size += len(data)
        if self.size <= self.limit:
            super().append(data)
            return
        self.over = True
        self.clear()  # what came is dropped with the request: it failed
        if self.deadline is not None:
            try:
                self.deadline.reschedule(asyncio.get_running_loop().time())
            except RuntimeError:  # its timeout already exited: the request is ending anyway
                pass

    def error_message(self) -> str:
        return f"the response passed {mib(self.limit)}, the most a response may hold; it was cut"
