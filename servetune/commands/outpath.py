"""Output paths checked before any work: a trial or a report that cannot be written is refused at
once, with one line naming the path, not after the minutes it took to produce.

Writability is tried, not inferred from mode bits (root passes every ``os.access`` check; a
read-only mount or an ACL does not show in the bits): a probe file is created and removed. A symlink
is written through, as a shell's ``>`` does, never replaced by the result; a symlink loop is named.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servetune.result import TrialResult


NAME_MAX = 255  # bytes in one file name: ext4, xfs, btrfs, tmpfs and overlayfs alike


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


def _no_loop(path: Path, option: str) -> None:
    """A name longer than the file system takes, or a symlink loop at the path or above it: pathlib calls a
    loop missing, which sent the user looking elsewhere, and a long name failed late as 'unexpected'."""
    for part in path.parts:
        size = len(os.fsencode(part))
        if size > NAME_MAX:
            shown = part[:40] + "..." if len(part) > 40 else part
            raise OutPathError(f"{option}: the name {shown!r} is {size} bytes long; file names take at most "
                               f"{NAME_MAX}")
    for where in (path.absolute().parent, path):
        try:
            os.stat(where)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise OutPathError(f"{option}: {where} is a symlink loop ({exc.strerror})") from None


def check_out_file(path: Path, option: str = "--out") -> Path:
    """A file to be written: not an existing folder, in an existing, writable folder. Returns the path to
    write: a symlink's target (a dangling link's target is created), so the link stays a link."""
    _no_loop(path, option)
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    if path.is_dir():
        raise OutPathError(f"{option}: {path} is a folder; give a file path, e.g. {path / 'result.json'}")
    if path.exists() and not path.is_file():
        raise OutPathError(f"{option}: {path} exists and is not a regular file")
    _writable_folder(path.absolute().parent, option)
    return path


def check_out_dir(path: Path, option: str = "--out", *, parents: bool = False) -> Path:
    """A folder to be written into (created if missing): not a file; it, or its parent, writable.
    ``parents``: missing folders above it are created too, so the nearest existing one must be writable."""
    _no_loop(path, option)
    if path.exists():
        if not path.is_dir():
            raise OutPathError(f"{option}: {path} exists and is not a folder")
        _writable_folder(path, option)
        return path
    above = path.absolute().parent
    while parents and not above.exists() and above != above.parent:
        if above.is_symlink():  # a dangling link on the way: mkdir would fail on it
            raise OutPathError(f"{option}: {above} is a symlink to nowhere")
        above = above.parent
    _writable_folder(above, option)
    return path


def write_result(result: TrialResult, out: Path) -> tuple[Path, str | None]:
    """Write a measured result to ``out``; when that fails at the end (a disk filled during the trial, a
    folder gone), keep it in the temp folder rather than lose what was measured. Returns where it is and,
    if not at ``out``, the one line saying why and where."""
    try:
        return result.save(out), None
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
    rescue = Path(tempfile.gettempdir()) / f"servetune-result-{result.trial_id}.json"
    try:
        result.save(rescue)
    except OSError as exc:
        return out, f"--out {out}: cannot write the result ({why}); nor to {rescue} ({exc.strerror}): it is lost"
    return rescue, f"--out {out}: cannot write the result ({why}); it was saved to {rescue} instead"
