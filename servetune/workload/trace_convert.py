"""Public LLM request traces -> servetune's timed trace JSONL (servetune.workload.trace).

Two sources: the Azure LLM inference traces (CSV ``TIMESTAMP,ContextTokens,GeneratedTokens``, the 2023
``AzureLLMInferenceTrace_{conv,code}.csv`` and the 2024 week-long ones, wall-clock timestamps with
100 ns digits) and the Mooncake trace (JSONL ``timestamp`` in ms, ``input_length``, ``output_length``,
``hash_ids``: requests whose first block hash agrees share a prefix, so it becomes ``prefix_group``).
Times are kept as integer nanoseconds until the end, so a week of 100 ns stamps loses nothing.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Literal

import orjson

from servetune.workload.jsonl import TraceError, jsonl_objects

Source = Literal["azure", "mooncake"]
SOURCES: tuple[str, ...] = ("azure", "mooncake")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")

_STAMP = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?\s*(Z|[+-]\d{2}:?\d{2})?")


@dataclass(slots=True)
class _Req:
    t_ns: int
    input_tokens: int
    output_tokens: int
    prefix_group: int | None = None


@dataclass(slots=True)
class Converted:
    """What a conversion wrote: how many rows, over how long, and what had to be adjusted."""

    rows: int
    span_s: float
    read: int  # rows of the source before the window and the limit
    raised_to_one: int  # token counts of 0 in the source, written as 1 (the trace format needs >= 1)

    def text(self, out: Path) -> str:
        rate = f", {(self.rows - 1) / self.span_s:.2f} req/s" if self.span_s > 0 else ""
        fixed = f"; {self.raised_to_one} zero token counts written as 1" if self.raised_to_one else ""
        return f"wrote {self.rows} of {self.read} requests to {out} ({self.span_s:.1f} s{rate}){fixed}"


def _azure_ns(text: str) -> int | None:
    """``2023-11-16 18:15:46.6805900`` (UTC unless it names an offset) -> ns since the epoch, or None."""
    m = _STAMP.fullmatch(text.strip())
    if m is None:
        return None
    day, clock, frac, tz = m.groups()
    try:
        whole = datetime.fromisoformat(f"{day} {clock}")
    except ValueError:
        return None
    if tz and tz != "Z":
        sign = 1 if tz[0] == "+" else -1
        hh, mm = int(tz[1:3]), int(tz[-2:])
        whole = whole.replace(tzinfo=timezone(sign * timedelta(hours=hh, minutes=mm)))
    else:
        whole = whole.replace(tzinfo=UTC)
    return int(whole.timestamp()) * 1_000_000_000 + int((frac or "").ljust(9, "0"))


def _count(where: str, name: str, raw: object) -> int:
    if isinstance(raw, str):
        raw = raw.strip()
        try:
            raw = int(raw) if raw.lstrip("-").isdigit() else float(raw)
        except ValueError:
            raise TraceError(f"{where}: {name} must be a token count, got {raw!r}") from None
    if (isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw) or raw < 0
            or raw != int(raw)):
        raise TraceError(f"{where}: {name} must be a token count (an integer >= 0), got {raw!r}")
    return int(raw)


def _read_azure(path: Path) -> list[_Req]:
    out = []
    with path.open(newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in AZURE_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(f"{path}: not an Azure LLM trace: no column {', '.join(missing)}"
                             f" (header: {','.join(reader.fieldnames or [])[:80] or 'none'})")
        for row in reader:
            where = f"{path}, line {reader.line_num}"
            t = _azure_ns(row["TIMESTAMP"] or "")
            if t is None:
                raise TraceError(f"{where}: TIMESTAMP must be a date and time like 2023-11-16 18:15:46.6805900,"
                                 f" got {row['TIMESTAMP']!r}")
            out.append(_Req(t, _count(where, "ContextTokens", row["ContextTokens"]),
                            _count(where, "GeneratedTokens", row["GeneratedTokens"])))
    return out


def _read_mooncake(path: Path) -> list[_Req]:
    out = []
    for lineno, obj in jsonl_objects(path):
        where = f"{path}, line {lineno}"
        for name in ("timestamp", "input_length", "output_length"):
            if name not in obj:
                raise TraceError(f"{where}: field {name!r} is missing (not a Mooncake trace?)")
        ts = obj["timestamp"]
        if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts) or ts < 0:
            raise TraceError(f"{where}: field 'timestamp' must be milliseconds >= 0, got {ts!r}")
        hashes = obj.get("hash_ids") or []
        if not isinstance(hashes, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in hashes):
            raise TraceError(f"{where}: field 'hash_ids' must be a list of integers, got {hashes!r}")
        out.append(_Req(round(ts * 1_000_000), _count(where, "input_length", obj["input_length"]),
                        _count(where, "output_length", obj["output_length"]),
                        hashes[0] if hashes and hashes[0] >= 0 else None))
    return out


def convert(source: str, src: str | Path, dst: str | Path, *, limit: int | None = None,
            start_s: float = 0.0, duration_s: float | None = None) -> Converted:
    """Read ``src`` in the ``source`` format, keep the window [start_s, start_s + duration_s) of it (seconds
    from its first request) and at most ``limit`` rows, and write servetune's trace JSONL to ``dst``."""
    if source not in SOURCES:
        raise TraceError(f"--from: {source!r} is not a known source ({' | '.join(SOURCES)})")
    if limit is not None and limit < 1:
        raise TraceError(f"--limit: must be >= 1, got {limit}")
    if start_s < 0 or (duration_s is not None and duration_s <= 0):
        raise TraceError(f"--start-s must be >= 0 and --duration-s > 0, got {start_s:g} and {duration_s}")
    src, dst = Path(src), Path(dst)
    if not src.is_file():
        raise TraceError(f"{src}: no such file")
    if not dst.parent.is_dir():
        raise TraceError(f"{dst}: its folder {dst.parent} does not exist")
    try:
        reqs = _read_azure(src) if source == "azure" else _read_mooncake(src)
    except UnicodeDecodeError as exc:
        raise TraceError(f"{src}: not UTF-8 text (offset {exc.start})") from None
    if not reqs:
        raise TraceError(f"{src}: no requests in it")
    reqs.sort(key=lambda r: r.t_ns)
    lo = reqs[0].t_ns + round(start_s * 1e9)
    hi = lo + round(duration_s * 1e9) if duration_s is not None else None
    kept = [r for r in reqs if r.t_ns >= lo and (hi is None or r.t_ns < hi)][:limit]
    if not kept:
        raise TraceError(f"{src}: no request in the window {start_s:g} s + {duration_s or 'inf'} s"
                         f" (the trace spans {(reqs[-1].t_ns - reqs[0].t_ns) / 1e9:.1f} s)")
    raised = 0
    lines = []
    for r in kept:
        raised += (r.input_tokens == 0) + (r.output_tokens == 0)
        row: dict[str, object] = {"arrival_s": round((r.t_ns - lo) / 1e9, 7),
                                  "input_tokens": max(1, r.input_tokens), "output_tokens": max(1, r.output_tokens)}
        if r.prefix_group is not None:
            row["prefix_group"] = r.prefix_group
        lines.append(orjson.dumps(row))
    dst.write_bytes(b"\n".join(lines) + b"\n")
    return Converted(len(kept), (kept[-1].t_ns - kept[0].t_ns) / 1e9, len(reqs), raised)
