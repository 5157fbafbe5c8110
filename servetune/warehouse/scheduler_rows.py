"""The scheduler's batch log lines of a trial (``server["scheduler_log"]``) as ``scheduler_batches`` rows.

Kept out of the loader so the rows are built (and checked) in one place that the loader and the
report's warehouse reader share: the loader COPYs them inside the trial's transaction and stores the
log's header without its rows in ``trials.server_info``; the reader puts them back.
"""

from __future__ import annotations

from typing import Any

#: scheduler_batches columns in COPY order, with their binary COPY types
COLUMNS = ("trial_id", "seq", "t_s", "kind", "new_seq", "new_token", "cached_token", "pending_token", "num_token",
           "running_req", "queue_req", "token_usage", "throughput", "cuda_graph")
TYPES = ["text", "int4", "float8", "text", "int4", "int4", "int4", "int4", "int4", "int4", "int4", "float8",
         "float8", "bool"]
COPY = (COLUMNS, TYPES)  # the loader's _copy(conn, table, columns, types, rows)
ROW_FIELDS = COLUMNS[2:]  # the fields of one parsed row (servetune.telemetry.scheduler_log)
_INTS = ("new_seq", "new_token", "cached_token", "pending_token", "num_token", "running_req", "queue_req")
_FLOATS = ("token_usage", "throughput")
KINDS = ("prefill", "decode")


def _opt(value: Any, cast: type) -> Any:
    return None if value is None else cast(value)


def rows(trial_id: str, server: dict[str, Any] | None, *, error: type[Exception] = ValueError) -> list[tuple]:
    """The trial's scheduler rows as COPY tuples (seq = position in the log); [] without a log.

    A row the table cannot hold raises ``error`` (the loader's LoadError) naming the trial, the index and why."""
    log = (server or {}).get("scheduler_log") or {}
    out = []
    for i, r in enumerate(log.get("rows") or []):
        try:
            if r["kind"] not in KINDS:
                raise ValueError(f"kind {r['kind']!r} is not one of {', '.join(KINDS)}")
            out.append((trial_id, i, float(r["t_s"]), r["kind"], *(_opt(r.get(k), int) for k in _INTS),
                        *(_opt(r.get(k), float) for k in _FLOATS), _opt(r.get("cuda_graph"), bool)))
        except (KeyError, TypeError, ValueError) as e:
            raise error(f"trial {trial_id}: server.scheduler_log.rows[{i}] is malformed ({e!r})") from None
    return out


def server_info(server: dict[str, Any] | None) -> dict[str, Any]:
    """``trials.server_info``: the server section without its bulk rows (those live in child tables)."""
    info = {k: v for k, v in (server or {}).items() if k != "samples"}
    log = info.get("scheduler_log")
    if isinstance(log, dict) and "rows" in log:
        info["scheduler_log"] = {**{k: v for k, v in log.items() if k != "rows"}, "row_count": len(log["rows"] or [])}
    return info


def as_log_row(stored: dict[str, Any]) -> dict[str, Any]:
    """A stored row back in the parser's shape (what ``server["scheduler_log"]["rows"]`` holds)."""
    return {k: stored[k] for k in ROW_FIELDS}
