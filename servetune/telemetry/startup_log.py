"""Where an SGLang server's start went, from the first lines of its own log.

A weekly run pays a server start before its first trial (on an H100 with an 8B model, 2 of its 4 GPU minutes),
and only the engine knows what that time bought: SGLang logs the weight load and each CUDA graph capture with
their own elapsed seconds, the KV pool's allocation and the moment it serves. The phases say which lever a start
has (fewer captured graph sizes, a page cache for the weights) before anyone buys GPU time to try one. The
timestamps have one-second resolution; the elapsed figures SGLang prints are kept as printed.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

_STAMP = re.compile(r"^\[(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})[^\]]*\]\s*(?P<rest>.*)$")
_WEIGHTS_BEGIN = re.compile(r"^Load weight begin\b")
_WEIGHTS_END = re.compile(r"^Load weight end\.(?: elapsed=(?P<s>[\d.]+) s)?")
_POOL_END = re.compile(r"^Memory pool end\b")
# 0.5.x: "Capture target prefill CUDA graph end. elapsed=65.40 s"; 0.4.x: "Capture cuda graph end. Time elapsed: 13.7 s"
_GRAPH_END = re.compile(r"^Capture (?:target )?(?:(?P<kind>prefill|decode) )?cuda graph end\. "
                        r"(?:elapsed=|Time elapsed: )(?P<s>[\d.]+) ?s", re.IGNORECASE)
_READY = re.compile(r"^The server is fired up and ready to roll")
MAX_LINES = 20_000  # a start's lines come first; the batch lines after them are not read


def _unix(stamp: str) -> float:
    return time.mktime(datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").timetuple())


def parse(lines: Iterable[str]) -> dict[str, Any] | None:
    """The start's phases in seconds, or None when the lines never reach "fired up" (a start that failed or a
    log that is not SGLang's):

    - ``logged_s``: first logged line to ready (the interpreter's imports before the first line are not in it)
    - ``before_weights_s``: first line to the weight load (scheduler process, imports, torch.distributed)
    - ``weights_s``, ``kv_cache_s``: the weight load (SGLang's figure), weights loaded to KV pool allocated
    - ``cuda_graphs_s``: every capture (SGLang's figures), with ``prefill_graphs_s`` and ``decode_graphs_s``
      where the version captures them apart
    - ``to_ready_s``: the last capture (or the pool) to ready: the HTTP server and its warm-up request
    """
    first = weights_begin = weights_end = pool_end = last_capture = ready = None
    weights_s, graphs = None, {"prefill": 0.0, "decode": 0.0, "": 0.0}
    for n, line in enumerate(lines):
        if n >= MAX_LINES:
            break
        m = _STAMP.match(line.strip())
        if m is None:
            continue
        t, rest = _unix(m["ts"]), m["rest"]
        first = t if first is None else first
        if _WEIGHTS_BEGIN.match(rest):
            weights_begin = t
        elif w := _WEIGHTS_END.match(rest):
            weights_end, weights_s = t, (float(w["s"]) if w["s"] else None)
        elif _POOL_END.match(rest):
            pool_end = t
        elif g := _GRAPH_END.match(rest):
            graphs[(g["kind"] or "").lower()] += float(g["s"])
            last_capture = t
        elif _READY.match(rest):
            ready = t
            break
    if first is None or ready is None:
        return None
    phases: dict[str, Any] = {"logged_s": ready - first}
    if weights_begin is not None:
        phases["before_weights_s"] = weights_begin - first
    if weights_s is not None:
        phases["weights_s"] = weights_s
    if weights_end is not None and pool_end is not None:
        phases["kv_cache_s"] = pool_end - weights_end
    if any(graphs.values()):
        phases["cuda_graphs_s"] = round(sum(graphs.values()), 2)
        phases.update({f"{k}_graphs_s": v for k, v in graphs.items() if k and v})
    if (since := last_capture or pool_end) is not None:
        phases["to_ready_s"] = ready - since
    return phases


def read(path: str | Path | None) -> dict[str, Any] | None:
    """The phases of the start logged in ``path`` (one log file per server start); None without one."""
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return parse(fh)
    except OSError:
        return None


def summary(phases: dict[str, Any]) -> str:
    """'108 s logged: CUDA graphs 69.7 s (prefill 65.4), weights 2.0 s, KV cache 1 s, ...'; '' for a record that
    is not a start's phases (a hand-edited trial file)."""
    num = {k: float(v) for k, v in phases.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    if "logged_s" not in num:
        return ""
    parts = []
    if "cuda_graphs_s" in num:
        split = f" (prefill {num['prefill_graphs_s']:.1f})" if "prefill_graphs_s" in num else ""
        parts.append(f"CUDA graphs {num['cuda_graphs_s']:.1f} s{split}")
    for key, name in (("weights_s", "weights"), ("kv_cache_s", "KV cache"), ("before_weights_s", "before the weights"),
                      ("to_ready_s", "to ready")):
        if key in num:
            parts.append(f"{name} {num[key]:.{1 if key == 'weights_s' else 0}f} s")
    return f"{num['logged_s']:.0f} s logged" + (": " + ", ".join(parts) if parts else "")
