"""What the campaign knows about one config at one level: its valid repeats, their verdict and noise.

Decisions never read a single trial. ``Evidence`` pools every VALID trial of a (config, level):
the SLA verdict by majority (a tie fails), "marginal" when the repeats disagree, and the spread
(mean, CV, 95% interval) of goodput, throughput and each p99. ``gather`` is the one place that
asks for more trials: the first one (sized to be valid), a re-sized re-run of an INVALID one,
the repeats a decisive comparison needs, and more repeats for a marginal level, up to the cap.
"""

from __future__ import annotations

from collections import Counter

from pydantic import BaseModel, ConfigDict, Field

from servetune.plan import Level, TuningPlan
from servetune.stats import Spread, spread
from servetune.tuning.verdict import judge
from servetune.tuning.sizing import size_trial
from servetune.tuning.state import CampaignState, Flags, TrialOutcome, TrialSpec, Verdict


class Evidence(BaseModel):
    """The pooled valid trials of one config at one level."""

    model_config = ConfigDict(extra="forbid")

    flags: Flags
    level: Level
    outcomes: list[TrialOutcome] = Field(default_factory=list, description="the valid ones")
    invalid_ids: list[str] = Field(default_factory=list)
    verdict: Verdict
    marginal: bool = False
    goodput: Spread = Field(default_factory=lambda: Spread(n=0))
    throughput: Spread = Field(default_factory=lambda: Spread(n=0))
    ttft_p99: Spread = Field(default_factory=lambda: Spread(n=0))
    tpot_p99: Spread = Field(default_factory=lambda: Spread(n=0))
    e2e_p99: Spread = Field(default_factory=lambda: Spread(n=0))

    @property
    def passed(self) -> bool:
        return self.verdict.passed

    @property
    def n(self) -> int:
        return len(self.outcomes)

    @property
    def trial_ids(self) -> list[str]:
        return [o.trial_id for o in self.outcomes]

    @property
    def representative(self) -> TrialOutcome | None:
        """The valid trial whose goodput is nearest the mean (its signals explain the level)."""
        if not self.outcomes:
            return None
        mean = self.goodput.mean or 0.0
        return min(self.outcomes, key=lambda o: abs((o.summary.goodput_rps or 0.0) - mean))


def pool(plan: TuningPlan, flags: Flags, level: Level, outcomes: list[TrialOutcome]) -> Evidence:
    """Evidence from every trial of (flags, level): the valid ones decide, the invalid ones are named."""
    valid = [o for o in outcomes if o.valid]
    invalid = [o.trial_id for o in outcomes if not o.valid]
    if not valid:
        last = outcomes[-1] if outcomes else None
        if last is not None and last.status == "failed":
            verdict = judge(last, plan.sla)
        else:
            why = "; ".join(last.summary.invalid_reasons) if last is not None else "not measured"
            verdict = Verdict(passed=False, kind="invalid",
                              reasons=[f"no valid measurement in {len(outcomes)} trial(s): {why}"])
        return Evidence(flags=flags, level=level, invalid_ids=invalid, verdict=verdict)
    verdicts = [judge(o, plan.sla) for o in valid]
    passes = sum(v.passed for v in verdicts)
    marginal = 0 < passes < len(verdicts)
    if passes * 2 > len(verdicts):
        verdict = Verdict(passed=True, kind="pass",
                          reasons=[f"passed {passes} of {len(verdicts)} repeats"] if marginal else [])
    else:
        failing = [v for v in verdicts if not v.passed]
        kind = Counter(v.kind for v in failing).most_common(1)[0][0]
        reasons = list(dict.fromkeys(r for v in failing for r in v.reasons))
        if len(verdicts) > 1:
            reasons.insert(0, f"failed {len(failing)} of {len(verdicts)} repeats")
        verdict = Verdict(passed=False, kind=kind, reasons=reasons)
    s = [o.summary for o in valid]
    return Evidence(
        flags=flags, level=level, outcomes=valid, invalid_ids=invalid, verdict=verdict, marginal=marginal,
        goodput=spread([x.goodput_rps or 0.0 for x in s]),
        throughput=spread([x.output_tokens_per_s for x in s]),
        ttft_p99=spread([x.ttft_ms.p99 for x in s]),
        tpot_p99=spread([x.tpot_ms.p99 for x in s]),
        e2e_p99=spread([x.e2e_ms.p99 for x in s]),
    )


def gather(plan: TuningPlan, state: CampaignState, flags: Flags, level: Level, *, stage: str, reason: str,
           repeats: int = 1) -> TrialSpec | Evidence:
    """The next trial (flags, level) needs, or its evidence once it has ``repeats`` valid trials
    (``repeats.max`` when marginal) or has used up its attempts."""
    everything = state.measurements(flags, level)
    faults = [o for o in everything if o.fault]
    outcomes = [o for o in everything if not o.fault]
    if faults and not outcomes:
        if len(faults) > plan.repeats.crash_retries:
            return pool(plan, flags, level, everything)  # a fault verdict: the engine keeps dying here
        requests, warmup, how = faults[-1].requests, faults[-1].warmup, "as the trial the engine died under"
        return TrialSpec(stage=stage, **plan.load_at(level), flags=flags, requests=requests, warmup=warmup,  # type: ignore[arg-type]
                         reason=f"{reason}: re-run after an engine crash ({len(faults)} so far)",
                         seed_offset=len(everything), sizing=how)
    ev = pool(plan, flags, level, outcomes)
    wanted = max(repeats, plan.repeats.max if ev.marginal and repeats > 1 else repeats)
    attempts_cap = wanted + plan.repeats.invalid_retries
    if ev.n >= wanted or len(outcomes) >= attempts_cap:
        return ev
    if outcomes and outcomes[-1].status == "failed" and not ev.n:
        return ev  # a server that refused the config or a failed load is a verdict, not noise
    if not ev.n and sum(not o.valid for o in outcomes) > plan.repeats.invalid_retries:
        return ev
    last_invalid = outcomes[-1] if outcomes and not outcomes[-1].valid else None
    if ev.n:
        requests, warmup, how = ev.outcomes[0].requests, ev.outcomes[0].warmup, "as the first repeat"
    else:
        requests, warmup, how = size_trial(plan, state, flags, level, stage, resize_from=last_invalid)
    if last_invalid is not None:
        why = f"{reason}: re-run of INVALID trial {last_invalid.trial_id[:8]}"
    elif ev.n:
        why = f"{reason}: repeat {ev.n + 1} of {wanted}" + (" (marginal: the verdict flipped)" if ev.marginal else "")
    else:
        why = reason
    return TrialSpec(stage=stage, **plan.load_at(level), flags=flags, requests=requests, warmup=warmup,  # type: ignore[arg-type]
                     reason=why, seed_offset=len(everything), sizing=how)
