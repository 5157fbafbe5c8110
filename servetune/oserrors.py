"""An OS error at the boundary, said in one line: the path, the cause and its errno name (docs/reliability.md).

Python's own text for a full disk is ``[Errno 28] No space left on device: 'runs/x/state.json'``; a user
needs the path first and the cause in words, and the caller adds what to do next (a campaign: --resume)."""

from __future__ import annotations

import errno
import os

from servetune.names import printable


def os_error_text(exc: OSError) -> str:
    """``<path>: <cause> (<ERRNO>)``, or the cause alone when the error names no path."""
    cause = exc.strerror or str(exc) or type(exc).__name__
    code = errno.errorcode.get(exc.errno or 0)
    if code:
        cause += f" ({code})"
    paths = [p for p in (exc.filename, exc.filename2) if p is not None]
    return f"{' -> '.join(printable(str(p)) for p in paths)}: {cause}" if paths else cause


def why_not_there(path: str | os.PathLike[str]) -> str:
    """Why ``path`` cannot be opened, for a caller that found it missing: pathlib calls a symlink loop or a name
    too long "missing" too, which sent users looking for a file that is there."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return "no such file or directory"
    except OSError as exc:
        return os_error_text(exc).rpartition(": ")[2] if exc.filename is not None else os_error_text(exc)
    return "not a file or folder it can read"
