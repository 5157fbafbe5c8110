"""One trial against the plan's limits: the one definition of a trial's pass/fail (the tuner's, the report's).

A failed trial fails; an INVALID one (servetune.validity) decides nothing and says so; then the
error rate, the p99 bounds, GPU memory, and for an open loop whether the server kept up.
"""

from __future__ import annotations

from servetune.result import TrialResult, TrialSummary
from servetune.sla import SLA
from servetune.tuning.state import ENGINE_CRASH, TrialOutcome, Verdict
from servetune.validity import cap_full


def judge(outcome: TrialOutcome, sla: SLA) -> Verdict:
    """Pass/fail of one trial: failed, rejected by the checklist, invalid, errors, the p99 bounds, GPU memory,
    an overloaded open loop."""
    if outcome.status == "rejected":  # decides nothing, like an INVALID trial: it is re-run
        return Verdict(passed=False, kind="invalid",
                       reasons=[f"rejected by the report checklist: {outcome.failure_reason or 'unknown'}"])
    return _judge(outcome.summary, sla, failed=outcome.status == "failed", fault=outcome.fault,
                  failure_reason=outcome.failure_reason)


def judge_result(result: TrialResult, sla: SLA) -> Verdict:
    """``judge`` on a stored trial (the report's): the same verdict the tuner gave its ``TrialOutcome``.

    ``TrialOutcome.from_result`` keeps only failed-or-not of the status, so a trial the checklist later
    ``rejected`` is judged here on its numbers; whoever shows the checklist's verdict says that apart.
    """
    failed = result.status == "failed"
    fault = failed and (result.failure_reason or "").startswith(ENGINE_CRASH)
    return _judge(result.summary, sla, failed=failed, fault=fault, failure_reason=result.failure_reason)


def _judge(s: TrialSummary, sla: SLA, *, failed: bool, fault: bool, failure_reason: str | None) -> Verdict:
    if fault:
        return Verdict(passed=False, kind="fault", reasons=[f"the engine died under the trial, not a capacity verdict:"
                                                            f" {failure_reason}"])
    if failed:
        return Verdict(passed=False, kind="failed", reasons=[f"trial failed: {failure_reason or 'unknown'}"])
    if s.sustained is False and not _client_fell_behind(s):
        # an open loop beyond capacity: its queue grows, so its window is no steady state either; the
        # server not keeping up is the verdict (only a client that could not send the load decides nothing)
        return Verdict(passed=False, kind="overload", reasons=[_overload_reason(s)])
    if s.valid is False:
        return Verdict(passed=False, kind="invalid", reasons=["INVALID: " + "; ".join(s.invalid_reasons)])
    if s.requests_measured == 0 or s.requests_ok == 0:
        return Verdict(passed=False, kind="failed", reasons=["no successful measured request"])
    reasons: list[str] = []
    kind = "pass"
    if s.error_rate > sla.max_error_rate:
        reasons.append(f"error rate {s.error_rate:.3f} > {sla.max_error_rate}")
        kind = "errors"
    for name, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "E2E")):
        bound = getattr(sla, f"p99_{name}_ms")
        value = getattr(s, f"{name}_ms").p99
        if bound is not None and (value is None or value > bound):
            shown = "missing" if value is None else f"{value:.1f} ms"
            reasons.append(f"p99 {label} {shown} > {bound:g} ms")
            kind = "sla" if kind == "pass" else kind
    if sla.gpu_memory_limit is not None and s.gpu_mem_peak_fraction is not None:
        if s.gpu_mem_peak_fraction > sla.gpu_memory_limit:
            reasons.append(f"GPU memory peak {s.gpu_mem_peak_fraction:.3f} > limit {sla.gpu_memory_limit}")
            kind = "memory" if kind == "pass" else kind
    return Verdict(passed=not reasons, kind=kind, reasons=reasons)  # type: ignore[arg-type]


def _client_fell_behind(s: TrialSummary) -> bool:
    """Late dispatches the client is to blame for; with the in-flight cap full it is the server's backlog."""
    floor = (s.validity_rules or {}).get("min_dispatch_fraction", 0.95)
    if cap_full(s.in_flight_mean, s.offered_concurrency):
        return False
    return s.dispatch_fraction is not None and s.dispatch_fraction < floor


def _overload_reason(s: TrialSummary) -> str:
    rules = s.validity_rules or {}
    if cap_full(s.in_flight_mean, s.offered_concurrency):
        why = f"all {s.offered_concurrency} in-flight slots stayed full and arrivals waited for them"
    elif s.latency_growth is not None:
        why = (f"latency per output token grew x{s.latency_growth:.2f} from the window's second quarter to its last"
               f" (limit x{rules.get('max_latency_growth', 1.5):g})")
    else:
        why = f"{s.completion_fraction or 0:.0%} of the arrivals completed one latency later"
    return f"the server fell behind the offered rate: {why}"
