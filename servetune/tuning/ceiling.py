"""Judging one trial against the plan, and finding the concurrency ceiling from the ramp.

The ceiling (seed article 3.3, step 4) is the highest level that meets the SLA, keeps GPU
memory under its limit, keeps errors under the threshold and still gains throughput.
"""

from __future__ import annotations

from servetune.plan import TuningPlan
from servetune.sla import SLA
from servetune.tuning.state import CampaignState, Ceiling, Flags, TrialOutcome, TrialSpec, Verdict


def judge(outcome: TrialOutcome, sla: SLA) -> Verdict:
    """Pass/fail of one trial: a failed trial, errors, the p99 bounds, then GPU memory."""
    if outcome.status == "failed":
        return Verdict(passed=False, kind="failed", reasons=[f"trial failed: {outcome.failure_reason or 'unknown'}"])
    s = outcome.summary
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


def throughput(outcome: TrialOutcome) -> float:
    """Throughput for the plateau test: output tokens/s, falling back to requests/s."""
    s = outcome.summary
    if s.output_tokens_per_s is not None:
        return s.output_tokens_per_s
    return s.request_throughput or 0.0


def ramp_levels(plan: TuningPlan) -> list[int]:
    return [plan.stages.baseline.concurrency, *plan.stages.ramp.levels]


def _spec(plan: TuningPlan, flags: Flags, level: int, stage: str, reason: str) -> TrialSpec:
    if stage == "baseline":
        st = plan.stages.baseline
        return TrialSpec(stage="baseline", concurrency=level, flags=flags, requests=st.requests,
                         warmup=st.warmup, reason=reason)
    rp = plan.stages.ramp
    return TrialSpec(stage=stage, concurrency=level, flags=flags, requests=rp.requests,  # type: ignore[arg-type]
                     warmup=rp.warmup, reason=reason)


def find_ceiling(plan: TuningPlan, state: CampaignState, flags: Flags) -> TrialSpec | Ceiling:
    """Walk baseline + ramp levels (then bisect) for ``flags``: the next trial to run, or the ceiling."""
    sla = plan.sla
    ramp = plan.stages.ramp
    last_pass: TrialOutcome | None = None
    stop: TrialOutcome | None = None
    verdict: Verdict | None = None
    plateau = False
    for i, level in enumerate(ramp_levels(plan)):
        o = state.lookup(flags, level)
        if o is None:
            stage = "baseline" if i == 0 else "ramp"
            why = "baseline at low concurrency" if i == 0 else f"ramp: level {level}"
            return _spec(plan, flags, level, stage, why)
        v = judge(o, sla)
        if not v.passed:
            stop, verdict = o, v
            break
        if last_pass is not None:
            before, now = throughput(last_pass), throughput(o)
            if before > 0 and now < before * (1 + ramp.min_gain):
                stop, plateau = o, True
                break
        last_pass = o
    if stop is None:
        assert last_pass is not None
        return Ceiling(level=last_pass.concurrency, kind="exhausted", pass_trial_id=last_pass.trial_id,
                       reasons=[f"every ramp level up to {last_pass.concurrency} passed; the ceiling may be higher"])
    if plateau:
        assert last_pass is not None
        gain = throughput(stop) / throughput(last_pass) - 1
        return Ceiling(level=last_pass.concurrency, kind="plateau", first_fail=stop.concurrency,
                       pass_trial_id=last_pass.trial_id, fail_trial_id=stop.trial_id,
                       reasons=[f"level {stop.concurrency} gained {gain:+.1%} throughput over {last_pass.concurrency}"
                                f" (< {ramp.min_gain:.0%})"])
    assert verdict is not None
    return _bisect(plan, state, flags, last_pass, stop, verdict)


def _bisect(
    plan: TuningPlan, state: CampaignState, flags: Flags, last_pass: TrialOutcome | None,
    first_fail: TrialOutcome, verdict: Verdict,
) -> TrialSpec | Ceiling:
    """Narrow the gap between the last pass and the first fail; with nothing passing, search down to 1."""
    ramp = plan.stages.ramp
    lo, hi = (last_pass.concurrency if last_pass else 0), first_fail.concurrency
    lo_o, hi_o, hi_v = last_pass, first_fail, verdict
    step = ramp.bisect_min_step if last_pass is not None else 1
    if ramp.bisect or last_pass is None:
        while hi - lo > step:
            mid = (lo + hi) // 2
            o = state.lookup(flags, mid)
            if o is None:
                return _spec(plan, flags, mid, "bisect", f"bisect between {lo or 'nothing'} (pass) and {hi} (fail)")
            v = judge(o, plan.sla)
            if v.passed:
                lo, lo_o = mid, o
            else:
                hi, hi_o, hi_v = mid, o, v
    return Ceiling(
        level=lo_o.concurrency if lo_o else None, kind=hi_v.kind if hi_v.kind != "pass" else "sla",
        first_fail=hi, reasons=[f"level {hi}: " + "; ".join(hi_v.reasons)],
        pass_trial_id=lo_o.trial_id if lo_o else None, fail_trial_id=hi_o.trial_id,
    )
