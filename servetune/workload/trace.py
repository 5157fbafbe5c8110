"""Timed trace replay: a JSONL file of real requests, each with its arrival time and lengths.

A workload with ``trace`` sends request ``i`` with row ``i``'s lengths (and system prompt group) and
stamps it with the row's arrival, so ``arrival: trace`` replays the recorded timing (docs/workload.md).
Rows are read once per file version (path, mtime, size) and kept sorted by arrival.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from servetune.workload.jsonl import TraceError, jsonl_objects


class TraceReplay(BaseModel):
    """A timed trace to replay: where it is, how fast, with which system prompts, and whether it repeats."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="JSONL trace: arrival_s, input_tokens, output_tokens[, prefix_group, session_id]")
    speed: float = Field(default=1.0, gt=0, description="2.0 replays twice as fast (arrivals divided by it)")
    prefix_tokens: int = Field(default=0, ge=0, description="system-prompt tokens of rows with a prefix_group"
                                                             " (0: no system prompts)")
    loop: bool = Field(default=False, description="more requests than rows repeat the trace, each lap shifted"
                                                  " by its span (false: asking for more is an error)")


@dataclass(frozen=True, slots=True)
class TraceRow:
    arrival_s: float  # seconds from the trace's start
    input_tokens: int
    output_tokens: int
    prefix_group: int = -1  # -1: no shared system prompt
    session_id: str | int | None = None  # kept for reference; nothing acts on it
    line: int = 0  # where it came from in the file


_INT_FIELDS = ("input_tokens", "output_tokens")


def _row(path: str, lineno: int, obj: dict) -> TraceRow:
    where = f"{path}, line {lineno}"
    for name in ("arrival_s", *_INT_FIELDS):
        if name not in obj:
            raise TraceError(f"{where}: field {name!r} is missing")
    arrival = obj["arrival_s"]
    if isinstance(arrival, bool) or not isinstance(arrival, int | float) or not math.isfinite(arrival) or arrival < 0:
        raise TraceError(f"{where}: field 'arrival_s' must be a number of seconds >= 0, got {arrival!r}")
    lengths = []
    for name in _INT_FIELDS:
        v = obj[name]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise TraceError(f"{where}: field {name!r} must be an integer >= 1, got {v!r}")
        lengths.append(v)
    group = obj.get("prefix_group")
    if group is not None and (isinstance(group, bool) or not isinstance(group, int) or group < 0):
        raise TraceError(f"{where}: field 'prefix_group' must be an integer >= 0, got {group!r}")
    session = obj.get("session_id")
    if session is not None and (isinstance(session, bool) or not isinstance(session, str | int)):
        raise TraceError(f"{where}: field 'session_id' must be a string or an integer, got {session!r}")
    return TraceRow(float(arrival), lengths[0], lengths[1], -1 if group is None else group, session, lineno)


@lru_cache(maxsize=16)
def _read_cached(path: str, mtime_ns: int, size: int) -> tuple[TraceRow, ...]:
    rows = [_row(path, lineno, obj) for lineno, obj in jsonl_objects(path)]
    if not rows:
        raise TraceError(f"{path}: the trace has no rows")
    rows.sort(key=lambda r: r.arrival_s)  # stable: rows arriving together keep the file's order
    return tuple(rows)


def read_trace(path: str | Path) -> tuple[TraceRow, ...]:
    """Every row of a JSONL trace, validated and sorted by arrival; cached by path, mtime and size."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        raise TraceError(f"{path}: trace file not found") from None
    if not p.is_file():
        raise TraceError(f"{path}: not a file")
    return _read_cached(str(p), st.st_mtime_ns, st.st_size)


class TraceSchedule:
    """A ``TraceReplay`` bound to its rows: request ``i``'s row, and its arrival after speed and laps."""

    def __init__(self, replay: TraceReplay):
        self.replay = replay
        self.rows = read_trace(replay.path)
        n = len(self.rows)
        first, last = self.rows[0].arrival_s, self.rows[-1].arrival_s
        # a lap lasts the trace's span plus one mean gap: the looped trace keeps its rate, and a lap's
        # first request never lands on the previous lap's last
        self.span_s = (last - first) * n / (n - 1) if n > 1 else 0.0
        if replay.loop and self.span_s <= 0:
            raise TraceError(f"{replay.path}: trace.loop needs rows spread over time (all {n} arrive at"
                             f" {first:g} s)")

    def __len__(self) -> int:
        return len(self.rows)

    def row(self, index: int) -> TraceRow:
        lap, k = divmod(index, len(self.rows))
        if lap and not self.replay.loop:
            raise TraceError(f"{self.replay.path}: request {index} asked of a trace of {len(self.rows)} rows"
                             " (ask for fewer requests, or set trace.loop: true to repeat it)")
        return self.rows[k]

    def arrival_s(self, index: int) -> float:
        lap = index // len(self.rows)
        return (self.row(index).arrival_s + lap * self.span_s) / self.replay.speed

    def prefix_group(self, index: int) -> int:
        """The row's group when system prompts are on (``prefix_tokens`` > 0), else -1."""
        return self.row(index).prefix_group if self.replay.prefix_tokens > 0 else -1
