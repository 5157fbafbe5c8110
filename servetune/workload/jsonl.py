"""Reading JSONL traces: one object per line, blank lines skipped, every error naming the file and line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson


class TraceError(ValueError):
    """A trace that cannot be used; the message names the file, line and field."""


def jsonl_objects(path: str | Path, data: bytes | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of ``path`` (or of ``data``, read from it)."""
    if data is None:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise TraceError(f"{path}: cannot read trace: {exc.strerror}") from None
    for lineno, raw in enumerate(data.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise TraceError(f"{path}, line {lineno}: not valid JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{path}, line {lineno}: expected a JSON object, got {type(obj).__name__}")
        yield lineno, obj
