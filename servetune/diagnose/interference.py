"""Rule 2: long-prompt interference. TTFT and ITL by input-length bucket, and whether short requests'
decode slows while a long prompt's prefill runs.

A long prefill shares the engine's steps with the running decodes: with a large
``--chunked-prefill-size`` one step carries thousands of prompt tokens and every decode in the batch
waits for it. Here a long request's prefill is taken to run between its send and its first token; each
per-token gap of a short request is "during" when its span overlaps one of those intervals. The
median gap during over the median gap outside is the slowdown. When the server's scheduler log was
read, the short requests' stalls are also lined up with its big prefill batches (1 s resolution).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from servetune.diagnose import Finding, every_measured, flag, r3, steady_set
from servetune.records import RequestRecord
from servetune.result import TrialResult

BUCKET_EDGES = (1024, 4096, 16384)  # prompt tokens: <1k, 1k-4k, 4k-16k, >=16k
LONG_PROMPT_MIN = 2048  # a long prompt has at least this many tokens ...
LONG_PROMPT_FACTOR = 4.0  # ... and at least 4x the median prompt
MIN_GAPS = 20  # fewer short-request gaps during (or outside) long prefills: no verdict
MIN_REQUESTS = 10  # ... without chunk times: fewer short requests decoding during (or outside) them
SLOWDOWN_WARN = 1.5  # median gap during / outside at or above: interference (warning)
SLOWDOWN_CRITICAL = 5.0  # ... at or above: decodes stall (critical)
STALL_FACTOR = 3.0  # a gap over 3x the median gap outside is a stall (for the scheduler-log alignment)


def _prompt(r: RequestRecord) -> int | None:
    return r.prompt_tokens if r.prompt_tokens is not None else r.requested_input_tokens


def _label(i: int) -> str:
    edges = (0, *BUCKET_EDGES)
    k = lambda v: f"{v // 1024}k" if v else "0"  # noqa: E731
    return f">={k(edges[i])}" if i == len(BUCKET_EDGES) else f"{k(edges[i])}-{k(edges[i + 1])}"


def _pcts(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None}
    a = np.asarray(values, dtype=np.float64)
    return {"p50": r3(float(np.percentile(a, 50))), "p99": r3(float(np.percentile(a, 99)))}


def _row(label: str, rs: list[RequestRecord]) -> dict[str, Any]:
    ttft = _pcts([r.ttft_ms for r in rs if r.ttft_ms is not None])
    itl = _pcts([g for r in rs for g in r.itl_gaps_ms()])
    tpot = _pcts([t for r in rs if (t := r.tpot_ms()) is not None])
    return {"bucket": label, "requests": len(rs), "ttft_p50_ms": ttft["p50"], "ttft_p99_ms": ttft["p99"],
            "itl_p50_ms": itl["p50"], "itl_p99_ms": itl["p99"], "tpot_p50_ms": tpot["p50"], "tpot_p99_ms": tpot["p99"]}


def buckets(records: list[RequestRecord]) -> list[dict[str, Any]]:
    """TTFT and ITL (per-token gaps) percentiles per input-length bucket, for the buckets with requests."""
    groups: dict[int, list[RequestRecord]] = {}
    for r in records:
        p = _prompt(r)
        if p is not None:
            groups.setdefault(int(np.searchsorted(BUCKET_EDGES, p, side="right")), []).append(r)
    return [_row(_label(i), groups[i]) for i in sorted(groups)]


def short_gaps(shorts: list[RequestRecord], intervals: np.ndarray) -> tuple[list[float], list[float], list[float]]:
    """Per-token gaps of the short requests, (during a long prefill, outside), and the mid-times of all gaps."""
    starts, ends = (intervals[:, 0], intervals[:, 1]) if intervals.size else (np.zeros(0), np.zeros(0))
    order = np.argsort(starts)
    starts, ends = starts[order], np.maximum.accumulate(ends[order]) if ends.size else ends
    during: list[float] = []
    outside: list[float] = []
    mids: list[float] = []
    for r in shorts:
        offs, toks = r.chunk_offsets_ms, r.chunk_tokens
        for i in range(1, len(offs)):
            a, b = r.t_send_s + offs[i - 1] / 1000.0, r.t_send_s + offs[i] / 1000.0
            k = toks[i] if i < len(toks) and toks[i] > 0 else 1
            gap = (offs[i] - offs[i - 1]) / k
            j = int(np.searchsorted(starts, b, side="left")) - 1  # the last interval starting before b
            overlaps = j >= 0 and ends[j] > a
            (during if overlaps else outside).append(gap)
            mids.append((a + b) / 2)
    return during, outside, mids


def short_tpots(shorts: list[RequestRecord], intervals: np.ndarray) -> tuple[list[float], list[float]]:
    """Without chunk times (records kept without them): the short requests' TPOT, (decode overlapped a long
    prefill, did not)."""
    during: list[float] = []
    outside: list[float] = []
    for r in shorts:
        tpot = r.tpot_ms()
        if tpot is None or r.ttft_ms is None or r.e2e_ms is None:
            continue
        a, b = r.t_send_s + r.ttft_ms / 1000.0, r.t_send_s + r.e2e_ms / 1000.0
        hit = bool(intervals.size) and bool(np.any((intervals[:, 0] < b) & (intervals[:, 1] > a)))
        (during if hit else outside).append(tpot)
    return during, outside


def diagnose(result: TrialResult) -> list[Finding]:
    tid = result.trial_id
    ok = [r for r in result.records if not r.warmup and r.ok and _prompt(r) is not None]
    if not ok:
        return [Finding(trial_id=tid, kind="interference.no_data", severity="info",
                        summary="no successful measured request with a prompt length: nothing to bucket")]
    # the table covers the summary's requests (the steady window), so its figures sit beside the summary's;
    # the interference test below reads the whole run: every long prefill counts, start-up burst included
    inside, named = steady_set(result)
    inside = [r for r in inside if _prompt(r) is not None]
    if not inside:
        inside, named = ok, f"{every_measured(len(ok))} (none completed inside the window)"
    table = buckets(inside)
    sets = {"buckets": table, "request_set": named, "requests_in_set": len(inside)}
    if len(inside) < len(ok):  # the whole run beside it: what the start-up burst and the drain add
        sets["whole_run"] = _row("whole run", ok)
        sets["whole_run_set"] = f"{every_measured(len(ok))} (warm-up left out)"
    prompts = np.asarray([_prompt(r) for r in ok], dtype=np.float64)
    median = float(np.median(prompts))
    long_min = max(LONG_PROMPT_MIN, LONG_PROMPT_FACTOR * median)
    longs = [r for r in ok if _prompt(r) >= long_min and r.ttft_ms is not None]  # type: ignore[operator]
    chunk = flag(result, "chunked_prefill_size")
    ev: dict[str, Any] = {"buckets": table, "tested_set": f"{every_measured(len(ok))} (whole run)",
                          "median_prompt": r3(median), "long_prompt_min": r3(long_min),
                          "long_requests": len(longs), "chunked_prefill_size": chunk}
    head = ", ".join(f"{b['bucket']}: {b['requests']} req, TTFT p50 {b['ttft_p50_ms']} ms, "
                     + (f"ITL p50 {b['itl_p50_ms']} ms" if b["itl_p50_ms"] is not None
                        else f"TPOT p50 {b['tpot_p50_ms']} ms")
                     for b in table)
    out = [Finding(trial_id=tid, kind="interference.by_input_length", severity="info", evidence=dict(sets),
                   summary=f"by input length, over {named}: {head}")]
    if not longs:
        out[0].summary += f" (no prompt of {long_min:.0f}+ tokens: no long-prompt interference to test)"
        return out
    intervals = np.asarray([(r.t_send_s, r.t_send_s + r.ttft_ms / 1000.0) for r in longs])  # type: ignore[operator]
    shorts = [r for r in ok if _prompt(r) <= median]  # type: ignore[operator]
    during, outside, _ = short_gaps(shorts, intervals)
    basis, need = "itl", MIN_GAPS
    if not during and not outside:  # records kept without chunk times: per-request TPOT instead
        (during, outside), basis, need = short_tpots(shorts, intervals), "tpot", MIN_REQUESTS
    ev.update(basis=basis, gaps_during=len(during), gaps_outside=len(outside))
    if len(during) < need or len(outside) < need:
        out.append(Finding(trial_id=tid, kind="interference.undecided", severity="info", evidence=ev,
                           summary=f"too few short-request gaps during ({len(during)}) or outside ({len(outside)})"
                                   f" long prefills to judge interference (need {need} each)"))
        return out
    m_in, m_out = float(np.median(during)), float(np.median(outside))
    slowdown = m_in / m_out if m_out > 0 else float("inf")
    ev.update(itl_p50_during_ms=r3(m_in), itl_p50_outside_ms=r3(m_out), itl_p90_during_ms=r3(np.percentile(during, 90)),
              itl_p90_outside_ms=r3(np.percentile(outside, 90)), slowdown=r3(slowdown))
    _align_with_scheduler_log(result, shorts, m_out, long_min, ev)
    if slowdown < SLOWDOWN_WARN:
        out.append(Finding(trial_id=tid, kind="interference.none", severity="info", evidence=ev,
                           summary=f"short requests decode at {m_in:.1f} ms/token during long prefills against"
                                   f" {m_out:.1f} outside (x{slowdown:.2f}, under x{SLOWDOWN_WARN:g}): no"
                                   " interference worth a flag"))
        return out
    out.append(Finding(
        trial_id=tid, kind="interference.long_prefill",
        severity="critical" if slowdown >= SLOWDOWN_CRITICAL else "warning", evidence=ev,
        summary=f"short requests' {basis.upper()} p50 is {m_in:.1f} ms while {len(longs)} long prompts"
                f" ({long_min:.0f}+ tokens) prefill, {m_out:.1f} ms otherwise (x{slowdown:.1f})",
        advice=_advice(chunk, flag(result, "enable_mixed_chunk"))))
    return out


def _align_with_scheduler_log(result: TrialResult, shorts: list[RequestRecord], m_out: float, long_min: float,
                              ev: dict[str, Any]) -> None:
    """Share of the short requests' stalls that fall in a second when the scheduler logged a big prefill batch."""
    rows = ((result.server or {}).get("scheduler_log") or {}).get("rows") or []
    big = sorted(float(r["t_s"]) for r in rows if r.get("kind") == "prefill" and (r.get("new_token") or 0) >= long_min)
    if not rows:
        return
    ev["sched_big_prefill_batches"] = len(big)
    stalls = [r.t_send_s + (r.chunk_offsets_ms[i - 1] + r.chunk_offsets_ms[i]) / 2000.0 for r in shorts
              for i in range(1, len(r.chunk_offsets_ms))
              if (r.chunk_offsets_ms[i] - r.chunk_offsets_ms[i - 1]) > STALL_FACTOR * m_out]
    if not stalls or not big:
        ev["stalls_aligned_with_big_prefills"] = None
        return
    b = np.asarray(big)
    idx = np.searchsorted(b, stalls)
    near = [min(abs(s - b[max(i - 1, 0)]), abs(b[min(i, b.size - 1)] - s)) <= 1.0
            for s, i in zip(stalls, idx, strict=True)]
    ev["short_stalls"] = len(stalls)
    ev["stalls_aligned_with_big_prefills"] = r3(sum(near) / len(stalls))


def _advice(chunk: object, mixed: object) -> str:
    """The chunked-prefill advice: without mixed chunks a prefill step takes the decode's place whatever its size."""
    now = f"now {chunk}" if chunk is not None else "the default"
    if mixed in (True, "true", "True", 1):
        return (f"lower --chunked-prefill-size ({now}): each step then carries a smaller piece of the long prompt"
                " beside the decodes (the long prompts' own TTFT rises a little)")
    return (f"add --enable-mixed-chunk and lower --chunked-prefill-size ({now}): without mixed chunks"
            " (SGLang's default) every prefill step takes the decodes' place, so they wait out the whole long"
            " prefill; with them each step carries a chunk of it beside the decodes, and a smaller chunk is a"
            " shorter step")
