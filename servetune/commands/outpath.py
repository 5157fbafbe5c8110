"""Output paths checked before any work: a trial or a report that cannot be written is refused at
once, with one line naming the path, not after the minutes it took to produce.

Writability is tried, not inferred from mode bits (root passes every ``os.access`` check; a
read-only mount or an ACL does not show in the bits): a probe file is created and removed.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


class OutPathError(ValueError):
    """The output path cannot be written; the message names the option and the path."""


def _writable_folder(folder: Path, option: str) -> None:
    if not folder.exists():
        raise OutPathError(f"{option}: folder {folder} does not exist (create it first)")
    if not folder.is_dir():
        raise OutPathError(f"{option}: {folder} is not a folder")
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".servetune-write-check-")
    except OSError as exc:
        raise OutPathError(f"{option}: folder {folder} is not writable ({exc.strerror or exc})") from None
    os.close(fd)
    os.unlink(probe)


def check_out_file(path: Path, option: str = "--out") -> Path:
    """A file to be written: not an existing folder, in an existing, writable folder."""
    if path.is_dir():
        raise OutPathError(f"{option}: {path} is a folder; give a file path, e.g. {path / 'result.json'}")
    if path.exists() and not path.is_file():
        raise OutPathError(f"{option}: {path} exists and is not a regular file")
    _writable_folder(path.absolute().parent, option)
    return path


def check_out_dir(path: Path, option: str = "--out") -> Path:
    """A folder to be written into (created if missing): not a file; it, or its parent, writable."""
    if path.exists():
        if not path.is_dir():
            raise OutPathError(f"{option}: {path} exists and is not a folder")
        _writable_folder(path, option)
    else:
        _writable_folder(path.absolute().parent, option)
    return path
