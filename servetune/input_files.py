"""Reading a file a user named (a plan, a workload, a result): only a regular file is read, so a FIFO, a device
or a socket gets one line instead of a read that blocks for ever (or never ends)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"))


def not_regular(path: str | Path) -> str | None:
    """Why ``path`` (its symlinks followed) is not a regular file to read, or None when it is one. A missing
    file, a symlink loop or a denied directory raise OSError with their own reason."""
    mode = os.stat(path).st_mode
    if stat.S_ISREG(mode):
        return None
    return next((f"is {what}, not a regular file" for test, what in _KINDS if test(mode)), "is not a regular file")


def read_bytes(path: str | Path) -> bytes:
    """The file's bytes; an OSError whose strerror says why for anything but a regular file (a directory: an
    IsADirectoryError, as reading one would raise)."""
    why = not_regular(path)
    if why is not None:
        if os.path.isdir(path):
            raise IsADirectoryError(errno.EISDIR, why, str(path))
        raise OSError(errno.EINVAL, why, str(path))
    return Path(path).read_bytes()
