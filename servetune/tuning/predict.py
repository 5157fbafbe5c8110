"""The calibrated simulator in the loop: refinement candidates it rules out are not measured.

Once the ceiling is found, the campaign's own accepted trials at the base flags (baseline, ramp, bisection)
are replayed in the simulator, trial for trial (same flags, level, size and seed), in virtual time. The ratio
measured / simulated goodput of each is the calibration; its median is the scale every prediction is shown
with, and its **held-out error** is leave-one-out: each trial predicted with the scale of the others, the
largest relative miss. A refinement candidate is simulated at the incumbent's level beside the incumbent; it
is **ruled out**, and never measured, when even twice that error cannot lift it to a tie
(simulated candidate / incumbent < 1 - 2 x error - ``refine.min_improvement``). A candidate that could tie or
win is measured as before, and its prediction is shown beside what was measured. The walk **abstains** (rules
nothing out, says why) when the plan has no simulator profile (an SGLang plan without ``estimate:``, another
engine), when fewer than ``predict.min_trials`` trials calibrate it, when the held-out error is above
``predict.max_error``, or in an open loop none of them failed the SLA (each then served its offered rate, in
the simulator too: goodput says nothing of the latency margin that decides the capacity).

What it cannot see: the error is measured at the base flags only, across levels, so a flag whose real effect
the simulator gets wrong is not caught by it; that is why only a candidate predicted clearly worse is
skipped, never one predicted to tie or win. Deterministic (the simulator under a seed), so the walk's replay
on every call asks the same questions; the simulations are memoised per plan.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from servetune.plan import Level, TuningPlan
from servetune.tuning.state import CampaignState, Flags, TrialOutcome, TrialSpec, config_key
from servetune.tuning.verdict import judge

BASE_STAGES = ("baseline", "ramp", "bisect")
_SIMULATED: dict[tuple[str, str, float, int, int, int], float | None] = {}


@dataclass(frozen=True)
class Calibration:
    scale: float | None = None  # median measured / simulated goodput over the calibrating trials
    error: float | None = None  # leave-one-out: the largest relative miss of a trial predicted from the others
    trials: int = 0
    abstain: str | None = None  # why nothing is ruled out


@dataclass
class Predictor:
    """Predictions for one call of the walk (cheap to rebuild: the simulations are memoised)."""

    plan: TuningPlan
    state: CampaignState
    base_flags: Flags
    calibration: Calibration = field(init=False)
    shown: list[str] = field(default_factory=list)  # predicted vs measured, one line per candidate measured
    skipped: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # simulations that raised (each rules nothing out)

    def __post_init__(self) -> None:
        from servetune.tuning.plan_identity import plan_digest
        from servetune.tuning.runner import SimTrialRunner

        self._digest = plan_digest(self.plan)  # once: every simulation's memo key starts with it
        self._runner = SimTrialRunner.for_plan(self.plan)  # one runner: its workloads are built once
        self.calibration = self._calibrate()

    def simulate(self, flags: Flags, level: Level, like: TrialOutcome) -> float | None:
        """Simulated goodput of ``flags`` at ``level``, sized and seeded as ``like`` (None: it failed to start)."""
        key = (self._digest, repr(sorted(flags.items())), float(level), like.requests, like.warmup,
               like.seed_offset)
        if key not in _SIMULATED:
            assert self._runner is not None  # a plan without a simulator profile abstains before simulating
            spec = TrialSpec(stage="refine", **self.plan.load_at(level), flags=flags, requests=like.requests,  # type: ignore[arg-type]
                             warmup=like.warmup, seed_offset=like.seed_offset)
            try:
                result = self._runner.run(spec, experiment_id="prediction").result
            except Exception as exc:  # noqa: BLE001 - a prediction that fails rules nothing out; the campaign goes on
                self.failures.append(f"{type(exc).__name__}: {exc}")
                return None
            _SIMULATED[key] = result.summary.goodput_rps if result.status == "ok" else None
        return _SIMULATED[key]

    def _calibrate(self) -> Calibration:
        section = self.plan.stages.refine.predict
        assert section is not None
        if self._runner is None:
            return Calibration(abstain="no simulator profile for this engine (an SGLang plan needs `estimate:`)")
        key = config_key(self.base_flags)
        base = [o for o in self.state.outcomes if o.stage in BASE_STAGES and o.key[0] == key and o.valid
                and (o.summary.goodput_rps or 0) > 0]
        if self.plan.rate_mode and base and not any(judge(o, self.plan.sla).kind == "sla" for o in base):
            # an open loop that meets its SLA serves its offered rate, as the simulator does: a 0% error that
            # knows nothing of the edge a candidate could move (the eleventh window's prediction said 0.0%)
            return Calibration(trials=len(base), abstain=f"none of the {len(base)} calibrating trial(s) failed the"
                                                         " SLA: in an open loop a passing trial's goodput is its"
                                                         " offered rate, so it cannot measure the simulator's error")
        pairs = [(o.summary.goodput_rps or 0.0, self.simulate(o.flags, o.level, o)) for o in base]
        ratios = [m / s for m, s in pairs if s]
        if len(ratios) < section.min_trials:
            failed = f" (the simulator failed: {self.failures[0]})" if self.failures else ""
            return Calibration(trials=len(ratios), abstain=f"{len(ratios)} trial(s) calibrate the simulator;"
                                                           f" it needs {section.min_trials}{failed}")
        misses = [abs(r / statistics.median(ratios[:i] + ratios[i + 1:]) - 1) for i, r in enumerate(ratios)]
        cal = Calibration(scale=statistics.median(ratios), error=max(misses), trials=len(ratios))
        if cal.error is not None and cal.error > section.max_error:
            return Calibration(scale=cal.scale, error=cal.error, trials=cal.trials,
                               abstain=f"its held-out error {cal.error:.1%} is above max_error {section.max_error:.0%}")
        return cal

    def header(self) -> str:
        c = self.calibration
        if c.abstain:
            return f"prediction abstained: {c.abstain}; every candidate measured"
        return (f"prediction: the simulator scaled x{c.scale:.3f} to {c.trials} measured trial(s) at the base"
                f" flags, held-out error {c.error:.1%}; a candidate it predicts cannot change the answer within"
                f" twice that error is not measured")

    def rules_out(self, flags: Flags, inc: TrialOutcome | None, level: Level, what: str, *,
                  tie_takes_it: bool = True, above: list[Level] | None = None) -> bool:
        """True (and said why) when the candidate cannot change the answer within the held-out error: it cannot
        even tie the incumbent; or, when a tie would keep the incumbent (``tie_takes_it`` False: the candidate is
        not simpler and the incumbent's verdict does not flip), it cannot win here and no level ``above`` lets it
        serve more than the incumbent does here by ``ramp.min_gain``."""
        c = self.calibration
        if c.abstain or inc is None or c.error is None:
            return False
        cand_g, inc_g = self.simulate(flags, level, inc), self.simulate(inc.flags, level, inc)
        if not inc_g:
            return False
        ratio, e = (cand_g or 0.0) / inc_g, 2 * c.error
        r = self.plan.stages.refine
        where = (f"{self._scaled(cand_g)} against the incumbent's {self._scaled(inc_g)} req/s"
                 f" at {self.plan.level_text(level)}")
        if ratio < 1 - e - r.min_improvement:
            self.skipped.append(f"{what}: not measured: predicted {where} ({ratio - 1:+.1%}, beyond twice the"
                                f" held-out error {c.error:.1%})")
            return True
        if tie_takes_it or ratio + e > 1 + r.min_improvement:
            return False
        gain = self.plan.stages.ramp.min_gain
        for up in above or []:
            up_g = self.simulate(flags, up, inc)
            if up_g is not None and up_g * (1 + e) > inc_g * (1 + gain):
                return False  # it might hold a level above with more goodput: measured, as a tie carried up
        self.skipped.append(f"{what}: not measured: predicted {where} ({ratio - 1:+.1%}): a tie at best, which"
                            f" keeps the incumbent, and no level above where it serves {gain:.0%} more (within"
                            f" twice the held-out error {c.error:.1%})")
        return True

    def measured(self, flags: Flags, level: Level, like: TrialOutcome | None, goodput: float | None, what: str) -> None:
        """Predicted vs measured, for a candidate the walk measured."""
        if self.calibration.abstain or like is None or goodput is None:
            return
        predicted = self.simulate(flags, level, like)
        if predicted is None or self.calibration.scale is None:
            return
        scaled = predicted * self.calibration.scale
        line = f"{what}: predicted {scaled:.2f}, measured {goodput:.2f} req/s ({goodput / scaled - 1:+.1%})"
        if line not in self.shown:
            self.shown.append(line)

    def _scaled(self, goodput: float | None) -> str:
        return "-" if goodput is None or self.calibration.scale is None else f"{goodput * self.calibration.scale:.2f}"
