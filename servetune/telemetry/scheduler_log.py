"""SGLang's own account of its batches: the scheduler's "Prefill batch" / "Decode batch" log lines.

Each prefill line says how many sequences and tokens it took in, how many came from the prefix
cache, the KV pool's usage, and how many requests ran and waited; each decode line (one every
``--decode-log-interval`` steps, 40 by default) says how many requests decode, the tokens held, the
usage and the generation throughput. They are the scheduler's view beside the client's records and
the ``/metrics`` gauges; ``servetune sim serve`` prints the same lines. The timestamps have one-second
resolution (``[2026-12-01 09:22:12]``, the server's local time), so a trial's lines are matched to
its span with a second of margin.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

_LINE = re.compile(r"^\[(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})[^\]]*\]"
                   r"\s*(?P<kind>Prefill|Decode) batch[.,]\s*(?P<rest>.*)$")
_FIELD = re.compile(r"(?P<key>[#\w][\w \-()/]*?):\s*(?P<value>[^,]+)")
#: log key -> (row field, type)
FIELDS: dict[str, tuple[str, type]] = {
    "#new-seq": ("new_seq", int),
    "#new-token": ("new_token", int),
    "#cached-token": ("cached_token", int),
    "token usage": ("token_usage", float),
    "#running-req": ("running_req", int),
    "#queue-req": ("queue_req", int),
    "#pending-token": ("pending_token", int),
    "#token": ("num_token", int),
    "cuda graph": ("cuda_graph", bool),
    "input throughput (token/s)": ("throughput", float),
    "gen throughput (token/s)": ("throughput", float),
}
ROW_FIELDS = ("t_unix", "kind", *dict.fromkeys(f for f, _ in FIELDS.values()))
MARGIN_S = 1.0  # the timestamps' resolution


def _value(raw: str, typ: type) -> Any:
    raw = raw.strip()
    if typ is bool:
        return raw.lower() == "true"
    try:
        return typ(float(raw)) if typ is int else typ(raw)
    except ValueError:
        return None


def parse_line(line: str) -> dict[str, Any] | None:
    """One batch line as a row (every field present, None where the line lacks it); None otherwise."""
    m = _LINE.match(line.strip())
    if m is None:
        return None
    ts = time.mktime(datetime.strptime(m["ts"], "%Y-%m-%d %H:%M:%S").timetuple())
    row: dict[str, Any] = dict.fromkeys(ROW_FIELDS)
    row["t_unix"], row["kind"] = float(ts), m["kind"].lower()
    for f in _FIELD.finditer(m["rest"]):
        spec = FIELDS.get(f["key"].strip())
        if spec is not None:
            row[spec[0]] = _value(f["value"], spec[1])
    return row


def parse(lines: Iterable[str]) -> tuple[list[dict[str, Any]], int]:
    """(batch rows, lines that looked like batch lines but did not parse)."""
    rows, bad = [], 0
    for line in lines:
        if "batch" not in line:
            continue
        row = parse_line(line)
        if row is None:
            bad += "Prefill batch" in line or "Decode batch" in line
            continue
        rows.append(row)
    return rows, bad


class LogTail:
    """The lines a log file gains from now on: remember its size at the start, read the rest at the end."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        self.offset = self._size()

    def _size(self) -> int:
        try:
            return self.path.stat().st_size if self.path else 0
        except OSError:
            return 0

    def read(self, max_bytes: int = 64 << 20) -> list[str]:
        if self.path is None:
            return []
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                data = fh.read(max_bytes)
        except OSError:
            return []
        return data.decode("utf-8", "replace").splitlines()


def capture(tail: LogTail, t0_unix: float, end_unix: float) -> dict[str, Any] | None:
    """The batch lines of one trial's span as ``server["scheduler_log"]``, times relative to t0; None if none."""
    if tail.path is None:
        return None
    rows, bad = parse(tail.read())
    kept = []
    for r in rows:
        if t0_unix - MARGIN_S <= r["t_unix"] <= end_unix + MARGIN_S:
            r = dict(r)
            r["t_s"] = round(r.pop("t_unix") - t0_unix, 3)
            kept.append(r)
    return {"parser": "sglang-scheduler-log", "source": tail.path.name, "rows": kept, "unparsed_lines": bad,
            "resolution_s": MARGIN_S}


def signals(log: dict[str, Any] | None) -> dict[str, Any]:
    """The summary's figures from the batch lines: counts, decode batch size, queue, usage, cache, CUDA graphs."""
    rows = (log or {}).get("rows") or []
    prefill = [r for r in rows if r["kind"] == "prefill"]
    decode = [r for r in rows if r["kind"] == "decode"]
    out: dict[str, Any] = {"sched_prefill_batches": len(prefill), "sched_decode_lines": len(decode)}

    def mean(xs: list[float]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    out["sched_decode_running_mean"] = mean([r["running_req"] for r in decode if r["running_req"] is not None])
    out["sched_gen_throughput_mean"] = mean([r["throughput"] for r in decode if r["throughput"] is not None])
    queues = [r["queue_req"] for r in rows if r["queue_req"] is not None]
    out["sched_queue_max"] = max(queues) if queues else None
    usage = [r["token_usage"] for r in rows if r["token_usage"] is not None]
    out["sched_token_usage_max"] = max(usage) if usage else None
    new = sum(r["new_token"] or 0 for r in prefill)
    cached = sum(r["cached_token"] or 0 for r in prefill)
    out["sched_cache_hit_rate"] = cached / (new + cached) if new + cached else None
    graphs = [r["cuda_graph"] for r in decode if r["cuda_graph"] is not None]
    out["sched_cuda_graph_fraction"] = sum(graphs) / len(graphs) if graphs else None
    return out
