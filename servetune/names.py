"""Names from outside (a plan's name, an engine's version, a trial id) are labels, never paths.

One rule (docs/reliability.md): what becomes part of a file or folder name is one safe path component
(printable, no separator, bounded, a digest where shortened), and what reaches the terminal is printable.
A plan's name is checked when the plan is read, so a bad one is refused in one line before anything runs.
"""

from __future__ import annotations

import hashlib
import re

#: the longest name a plan may have (a folder name adds an id to it; file systems stop at 255 bytes)
MAX_NAME = 100
_UNSAFE = re.compile(r"[^A-Za-z0-9._+=@,-]")


def check_label(value: str, max_len: int = MAX_NAME) -> str:
    """``value`` when it can name a folder as it is: printable, no path separator, not '.' or '..', at most
    ``max_len`` characters; else ValueError saying which rule it breaks."""
    if len(value) > max_len:
        raise ValueError(f"{len(value)} characters; a name has at most {max_len}")
    if not value.isprintable():
        raise ValueError(f"{printable(value)} holds a control character (a newline, tab or escape)")
    if "/" in value or "\\" in value or value in (".", ".."):
        raise ValueError(f"{value!r} is a label, not a path: no '/', '\\', '.' or '..'")
    if value != value.strip():
        raise ValueError(f"{value!r} starts or ends with blanks")
    return value


def safe_component(text: str, max_len: int = 80) -> str:
    """One path component made from ``text``: characters outside [A-Za-z0-9._+=@,-] become '_', no leading
    '.', and a text longer than ``max_len`` keeps its head and a digest of the whole (two names stay apart)."""
    out = _UNSAFE.sub("_", text).lstrip(".") or "_"
    if len(out) > max_len:
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:10]
        out = f"{out[:max_len - 11]}-{digest}"
    return out


def printable(text: str, max_len: int = 200) -> str:
    """``text`` for the terminal: control characters (ANSI escapes, newlines) shown escaped, and bounded."""
    shown = text if text.isprintable() else text.encode("unicode_escape").decode("ascii")
    return shown if len(shown) <= max_len else shown[:max_len - 1] + "…"
