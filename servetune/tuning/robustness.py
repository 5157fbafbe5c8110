"""The answer under bursts: the chosen config re-measured as an open loop with gamma arrivals.

A config can tie or win in the trials that chose it (a closed loop, or Poisson arrivals) and still
fail once arrivals come in bursts: a ``max-running-requests`` cap sized to a closed loop's streams
queues every burst above it. So, when the plan asks for it (``robustness``), the chosen config runs
at each of ``fractions`` of the rate it serves (its capacity in rate mode, its measured request rate
in a closed loop) under gamma arrivals of shape ``burstiness``; the checks are the margin the
report shows. When the chosen config differs from the ramp's and fails the lowest fraction, the
ramp's config is measured the same way, and recommended instead if it holds there; its margin then
also lists the checks it had at its own rate (run before the refinement), the rate it is recommended at.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from servetune.plan import TuningPlan
from servetune.tuning.sizing import size_open_loop
from servetune.tuning.state import CampaignState, TrialOutcome, TrialSpec, config_key
from servetune.tuning.verdict import judge

IN_FLIGHT_CAP = 1024  # a closed-loop plan names no cap for its open-loop checks


class RobustnessResult(BaseModel):
    """Every check run, the config to recommend instead (or None), and what it means in words."""

    model_config = ConfigDict(extra="forbid")

    checks: list[dict[str, Any]] = Field(default_factory=list)
    fallback: TrialOutcome | None = None
    notes: list[str] = Field(default_factory=list)


def served_rate(o: TrialOutcome) -> float:
    """The rate a config served where it was chosen: its offered rate, or a closed loop's request rate."""
    return o.rate if o.rate is not None else (o.summary.request_throughput or 0.0)


def robustness(plan: TuningPlan, state: CampaignState, chosen: TrialOutcome,
               ramp: TrialOutcome | None) -> TrialSpec | RobustnessResult:
    """The next check to run, or the result once every check has its (valid, or retried) trial."""
    section = plan.robustness
    if section is None or served_rate(chosen) <= 0:
        return RobustnessResult()
    mine = _checks(plan, state, chosen, "chosen")
    if isinstance(mine, TrialSpec):
        return mine
    notes = [_margin(plan, mine, chosen)]
    if mine[0]["passed"] or ramp is None or config_key(ramp.flags) == config_key(chosen.flags):
        return RobustnessResult(checks=mine, notes=notes)
    theirs = _checks(plan, state, ramp, "ramp", rate=served_rate(chosen))
    if isinstance(theirs, TrialSpec):
        return theirs
    if theirs[0]["passed"]:
        # recommended at its own rate: the checks run there before the refinement are its margin
        seen = {c["trial_id"] for c in theirs}
        own = _checks(plan, state, ramp, "ramp", ran_only=True)
        assert not isinstance(own, TrialSpec)
        theirs += [c for c in own if c["trial_id"] not in seen]
        notes.append(f"the ramp's config holds {theirs[0]['rate']:g} req/s under the same bursts where the refined"
                     " one fails: recommending the ramp's config (a refinement that only holds without bursts"
                     " is not kept)")
        return RobustnessResult(checks=mine + theirs, fallback=ramp, notes=notes)
    notes.append("the ramp's config fails the same bursts too: the refined config stays")
    return RobustnessResult(checks=mine + theirs, notes=notes)


def checks_so_far(plan: TuningPlan, state: CampaignState, chosen: TrialOutcome) -> RobustnessResult:
    """The chosen config's checks that have a trial, when the campaign must stop before the rest
    (a GPU budget spent): the recommendation keeps the margin measured, and says what is missing."""
    if plan.robustness is None or served_rate(chosen) <= 0:
        return RobustnessResult()
    ran = _checks(plan, state, chosen, "chosen", ran_only=True)
    assert not isinstance(ran, TrialSpec)
    missing = [f"{f:.0%}" for f in plan.robustness.fractions if f not in {c["fraction"] for c in ran}]
    notes = [_margin(plan, ran, chosen)] if ran else []
    if missing:
        notes.append(f"robustness not measured at {', '.join(missing)} of the rate: the campaign stopped first")
    return RobustnessResult(checks=ran, notes=notes)


def _checks(plan: TuningPlan, state: CampaignState, o: TrialOutcome, which: str,
            rate: float | None = None, ran_only: bool = False) -> list[dict[str, Any]] | TrialSpec:
    assert plan.robustness is not None
    b = plan.robustness.burstiness
    base = rate if rate is not None else served_rate(o)
    cap = plan.load.max_in_flight if plan.load is not None else IN_FLIGHT_CAP
    out = []
    for fraction in plan.robustness.fractions:
        r = round(fraction * base, 3)
        tried = [x for x in state.outcomes if x.stage == "robustness" and x.rate == r and x.burstiness == b
                 and config_key(x.flags) == config_key(o.flags)]
        valid = [x for x in tried if x.valid or judge(x, plan.sla).kind == "overload"]
        if ran_only and not tried:
            continue
        if not ran_only and not valid and len(tried) <= plan.repeats.invalid_retries:
            last = tried[-1] if tried else None
            st = plan.stages.ramp
            requests, warmup, how = size_open_loop(plan, state, o.flags, r, st.requests, st.warmup,
                                                   max(plan.validation.min_window_s, st.duration_s or 0.0), last)
            return TrialSpec(stage="robustness", concurrency=cap, rate=r, burstiness=b, flags=dict(o.flags),
                             requests=requests, warmup=warmup, seed_offset=len(tried), sizing=how,
                             reason=f"robustness: the {which} config at {fraction:.0%} of {base:.3g} req/s under gamma"
                                    f" arrivals (burstiness {b:g})" + (" (re-run of an INVALID one)" if last else ""))
        x = (valid or tried)[-1]
        v = judge(x, plan.sla)
        s = x.summary
        out.append({"config": which, "fraction": fraction, "rate": r, "burstiness": b, "passed": v.passed,
                    "kind": v.kind, "reasons": v.reasons, "p99_ttft_ms": s.ttft_ms.p99, "p99_tpot_ms": s.tpot_ms.p99,
                    "goodput_rps": s.goodput_rps, "trial_id": x.trial_id})
    return out


def _margin(plan: TuningPlan, checks: list[dict[str, Any]], chosen: TrialOutcome) -> str:
    assert plan.robustness is not None
    parts = [f"{c['fraction']:.0%} ({c['rate']:g} req/s): " + ("passes" if c["passed"] else
             "fails: " + "; ".join(c["reasons"])) for c in checks]
    held = [c["fraction"] for c in checks if c["passed"]]
    margin = f"holds up to {max(held):.0%}" if held else "holds at none of them"
    return (f"robustness under gamma arrivals (burstiness {plan.robustness.burstiness:g}) at fractions of"
            f" {served_rate(chosen):.3g} req/s: {margin}; " + ", ".join(parts))
