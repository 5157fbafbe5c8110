"""One process at a time runs a campaign folder's trials.

A killed Airflow scheduler takes its task supervisors with it, but not the task processes (each runs in its
own process group): the orphaned attempt goes on measuring while the retried one resumes from the same
folder. Two writers would run trials twice and share the GPU. The lock is an ``flock`` on a file in the
folder, so it dies with its holder (a crash never leaves it held) and the next attempt resumes from what
the holder finished.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from servetune.experiment import ResultFolder


class CampaignBusy(RuntimeError):
    """Another live process holds the campaign folder."""


@contextmanager
def campaign_lock(folder: str | Path, *, wait_s: float = 0.0, poll_s: float = 1.0, note_every_s: float = 60.0,
                  on_wait: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold ``folder``'s lock for the block; wait up to ``wait_s`` for its holder (``on_wait`` told who, on
    the first try and every ``note_every_s``), then raise ``CampaignBusy`` naming it."""
    path = ResultFolder(folder).lock_file
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline, next_note = time.monotonic() + wait_s, 0.0
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = os.pread(fd, 300, 0).decode(errors="replace").strip() or "a process"
                now = time.monotonic()
                if now >= deadline:
                    raise CampaignBusy(f"{folder}: {holder} is running this campaign") from None
                if on_wait is not None and now >= next_note:
                    on_wait(holder)
                    next_note = now + note_every_s
                time.sleep(min(poll_s, max(0.0, deadline - now)))
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since "
                      f"{datetime.now(UTC).isoformat(timespec='seconds')}".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock
