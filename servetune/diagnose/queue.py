"""Rule 5: the queue, retractions and rejections, read against the memory reserve.

SGLang admits a request when its KV fits the pool (with ``--schedule-conservativeness`` of margin for
the tokens still to come) and the running count is under ``--max-running-requests``; a pool that runs
full mid-decode retracts requests (their KV is dropped and recomputed later). Which limit held the
queue decides the flag: the pool (memory) or the cap (a count), and whether the GPU had room for a
bigger pool (its peak under ``GPU_HEADROOM``).
"""

from __future__ import annotations

from typing import Any

from servetune.diagnose import Finding, flag, r3
from servetune.result import TrialResult

POOL_FULL = 0.8  # KV pool occupancy (token usage) at or above, or any retraction: the pool is the limit (SGLang
# admits against the pool less what running requests are still expected to write: a pool refusing new requests
# reads 75-85% used, seen in the simulator with a 20k-token pool)
QUEUE_MEAN_MIN = 1.0  # requests waiting on average (server gauge) at or above: a queue worth naming
GPU_HEADROOM = 0.9  # GPU memory peak under this fraction: room to grow the pool (raise --mem-fraction-static)
REJECT_CRITICAL = 0.05  # share of measured requests refused (HTTP 503) at or above: critical


def _pool_advice(peak: float | None, mfs: Any) -> str:
    now = f" (now {mfs})" if mfs is not None else ""
    if peak is not None and peak < GPU_HEADROOM:
        return (f"the GPU peaked at {peak:.0%}: raise --mem-fraction-static{now} to grow the KV pool; or lower"
                " --max-running-requests")
    return f"the GPU is full: lower --max-running-requests or the context; --mem-fraction-static{now} cannot grow"


def diagnose(result: TrialResult) -> list[Finding]:
    tid, s = result.trial_id, result.summary
    usage = s.server_token_usage_max if s.server_token_usage_max is not None else s.sched_token_usage_max
    peak = s.gpu_mem_peak_fraction
    mfs, cons = flag(result, "mem_fraction_static"), flag(result, "schedule_conservativeness")
    cap = flag(result, "max_running_requests")
    ev: dict[str, Any] = {
        "queue_reqs_mean": r3(s.server_queue_reqs_mean), "queue_reqs_max": r3(s.server_queue_reqs_max),
        "running_reqs_mean": r3(s.server_running_reqs_mean), "token_usage_max": r3(usage),
        "retractions": r3(s.server_retractions), "gpu_mem_peak_fraction": r3(peak), "mem_fraction_static": mfs,
        "schedule_conservativeness": cons, "max_running_requests": cap,
        "rejected_503": int(s.errors_by_class.get("rejected_503", 0)),
    }
    out: list[Finding] = []
    if s.server_retractions:
        out.append(Finding(
            trial_id=tid, kind="queue.retractions", severity="warning", evidence=ev,
            summary=f"{s.server_retractions:.0f} requests retracted: the KV pool ran full mid-decode"
                    f" (token usage up to {_pct(usage)}); their work is redone",
            advice=f"raise --schedule-conservativeness (now {cons if cons is not None else 1.0}) so fewer requests are"
                   f" admitted than the pool holds at full length; {_pool_advice(peak, mfs)}"))
    rejected, measured = ev["rejected_503"], max(s.requests_measured, 1)
    if rejected:
        share = rejected / measured
        out.append(Finding(
            trial_id=tid, kind="queue.rejections", severity="critical" if share >= REJECT_CRITICAL else "warning",
            evidence={**ev, "rejected_share": r3(share)},
            summary=f"{rejected} requests ({share:.1%}) refused with HTTP 503: the server's queue was full or it"
                    " shed load",
            advice="offer less load, or let the server queue more (--max-queued-requests); a refusal is never a"
                   " latency"))
    if s.server_queue_reqs_mean is None:
        if not out:
            out.append(Finding(trial_id=tid, kind="queue.no_data", severity="info", evidence=ev,
                               summary="no server queue gauge (SGLang without --enable-metrics?): the queue is not"
                                       " read"))
        return out
    if s.server_queue_reqs_mean < QUEUE_MEAN_MIN:
        if not out:
            out.append(Finding(trial_id=tid, kind="queue.none", severity="info", evidence=ev,
                               summary=f"requests hardly queued at the server ({s.server_queue_reqs_mean:.1f}"
                                       f" waiting on average, {_pct(usage)} of the KV pool at most)"))
        return out
    if (usage is not None and usage >= POOL_FULL) or s.server_retractions:
        out.append(Finding(
            trial_id=tid, kind="queue.memory_bound", severity="warning", evidence=ev,
            summary=f"{s.server_queue_reqs_mean:.1f} requests waited on average with the KV pool up to {_pct(usage)}"
                    " full: memory held them",
            advice=_pool_advice(peak, mfs)))
    else:
        at_cap = cap is not None and s.server_running_reqs_mean is not None \
            and s.server_running_reqs_mean >= 0.9 * float(cap)
        advice = (f"raise --max-running-requests (now {cap}): the pool has room" if at_cap else
                  "not memory: prefill admission held them (each step admits up to --max-prefill-tokens /"
                  " --chunked-prefill-size of new prompt); a larger --chunked-prefill-size admits faster, or the level"
                  " is past the server's prefill capacity")
        out.append(Finding(
            trial_id=tid, kind="queue.cap_bound" if at_cap else "queue.admission_bound", severity="info", evidence=ev,
            summary=f"{s.server_queue_reqs_mean:.1f} requests waited on average"
                    f" (max {s.server_queue_reqs_max:.0f}) with the KV pool at most {_pct(usage)} full: not memory",
            advice=advice))
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"
