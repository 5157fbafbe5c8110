"""How many requests a trial needs so that its steady window can pass the validity rules.

A closed loop of T requests (warm-up W included) at concurrency c has a steady window from the
c-th completion to the last dispatch, which is the (T - c)-th completion: about T - 2c
completions, of which the measured ones are the requests that count. So a level needs
``completions_needed(c) + 2c - W`` measured requests, and ``rate x window + 2c - W`` to make
the window long enough, where the rate is estimated from what the campaign already measured
(throughput grows at most in proportion to the streams, so scaling a lower level's rate up
by c / c_lower over-estimates it, and an over-estimate only lengthens the trial). The plan's
``requests`` is a floor; ``budget.max_requests_per_trial`` a cap. An open loop (rate mode) knows
its rate: ``rate x window`` measured requests, and at least the completions the rules ask for.
"""

from __future__ import annotations

import math

from servetune.plan import Level, TuningPlan
from servetune.tuning.state import CampaignState, Flags, TrialOutcome

SAFETY = 1.15  # margin for the estimate and the boundary effects of the window
RESIZE = 1.3  # an INVALID trial is re-run this much bigger than its own rate asks for
WINDOW_E2E = 3.0  # open loop: the window spans at least this many mean latencies
WARMUP_FILL = 1.5  # open loop: warm-up requests per request in flight (the E2E estimate comes from lower rates)


def turns_per_unit(plan: TuningPlan) -> int:
    """Requests per load unit: a multi-turn workload in ``sessions`` mode is offered as users (the window rules
    count sessions, a stream holds one at a time), so a trial sized in sessions has this many requests each."""
    mt = plan.workload.multi_turn
    return mt.turns if mt is not None and mt.mode == "sessions" else 1


def stage_floor(plan: TuningPlan, stage: str) -> tuple[int, int, float | None]:
    """(requests floor, warm-up, duration_s) the plan gives a stage."""
    st = plan.stages
    if stage == "baseline":
        return st.baseline.requests, st.baseline.warmup, st.baseline.duration_s
    if stage == "refine":
        requests, warmup = plan.refine_requests()
        return requests, warmup, st.ramp.duration_s
    return st.ramp.requests, st.ramp.warmup, st.ramp.duration_s


def _rate(o: TrialOutcome) -> float | None:
    """Completed requests per second, over the window or (no window) the whole span."""
    s = o.summary
    if s.request_throughput:
        return s.request_throughput
    if s.e2e_ms.mean and o.concurrency:
        return o.concurrency / (s.e2e_ms.mean / 1000.0)  # Little's law
    return None


def estimate_rate(state: CampaignState, flags: Flags, level: Level) -> tuple[float | None, str]:
    """An upper estimate of the request rate at ``level``, and where it came from."""
    measured = [o for o in state.outcomes if o.status != "failed" and _rate(o)]
    for pool, label in (([o for o in measured if o.flags == flags and o.stage != "correctness"], "same config"),
                        ([o for o in measured if o.stage != "correctness"], "another config"),
                        ([o for o in measured if o.stage == "correctness"], "the correctness trial")):
        if not pool:
            continue
        below = [o for o in pool if o.concurrency <= level]
        ref = max(below, key=lambda o: o.concurrency) if below else min(pool, key=lambda o: o.concurrency)
        rate = _rate(ref) * max(1.0, level / ref.concurrency)  # type: ignore[operator]
        return rate, f"{rate:.2f} req/s from level {ref.concurrency} ({label})"
    return None, "no measurement yet"


def size_trial(plan: TuningPlan, state: CampaignState, flags: Flags, level: Level, stage: str,
               *, resize_from: TrialOutcome | None = None, prior: tuple[float, str] | None = None
               ) -> tuple[int, int, str]:
    """(measured requests, warm-up, how) for a trial of ``flags`` at ``level``; ``prior`` (a request rate and
    where it came from: a warm start's last answer at this level) stands in for a rate this campaign has only
    read off its correctness trial (one stream's rate scaled up: twice the real one at 64 streams)."""
    rules = plan.validation.rules()
    floor, warmup, duration = stage_floor(plan, stage)
    window = max(rules.min_window_s, duration or 0.0)
    if plan.rate_mode:
        return size_open_loop(plan, state, flags, float(level), floor, warmup, window, resize_from)
    turns = turns_per_unit(plan)
    tail = max(0, 2 * level * turns - warmup)
    needed = math.ceil(rules.completions_needed(level) * SAFETY) * turns + tail
    parts = [f"floor {floor}", f"{rules.completions_needed(level)} completions"
             + (f" (sessions of {turns} requests)" if turns > 1 else "")]
    if resize_from is not None and (own := _rate(resize_from)):
        rate, how = own, f"re-sized from the INVALID trial {resize_from.trial_id[:8]} ({own:.2f} req/s)"
        factor = RESIZE
    else:
        rate, how = estimate_rate(state, flags, level)
        if prior is not None and (rate is None or how.endswith("(the correctness trial)")):
            rate, how = prior
        factor = 1.0
    requests = max(floor, needed)
    if rate:
        by_time = math.ceil(rate * window * SAFETY) + tail
        parts.append(f"{window:g} s at {how}")
        requests = max(requests, by_time)
    requests = math.ceil(requests * factor)
    if resize_from is not None:  # a re-run is never smaller than the trial it replaces
        requests = max(requests, math.ceil(resize_from.requests * RESIZE))
    cap = plan.budget.max_requests_per_trial
    if requests > cap:
        parts.append(f"capped at budget.max_requests_per_trial {cap}")
        requests = cap
    return requests, warmup, "; ".join(parts)


def _e2e_estimate(state: CampaignState, flags: Flags, rate: float) -> tuple[float | None, str]:
    """Seconds a request takes near ``rate``: the slowest mean E2E measured at or below it (this config
    first); latency only grows with the rate, so the estimate errs long. Accepted trials only, where there are
    any: one slow INVALID trial (a server far behind from its first request on: 11.7 s of E2E at 12 req/s where
    the re-run took 2.7) would otherwise size every later warm-up from its outlier (docs/gpu.md, "The tenth
    window")."""
    done = [o for o in state.outcomes if o.status != "failed" and o.stage != "correctness" and o.summary.e2e_ms.mean]
    done = [o for o in done if o.valid] or done
    for pool, label in (([o for o in done if o.flags == flags], "same config"), (done, "another config")):
        below = [o for o in pool if o.rate is not None and o.rate <= rate] or pool
        if below:
            e2e = max(o.summary.e2e_ms.mean for o in below) / 1000.0  # type: ignore[operator, type-var]
            return e2e, f"E2E {e2e:.2f} s ({label})"
    return None, "no E2E measured yet"


def size_open_loop(plan: TuningPlan, state: CampaignState, flags: Flags, rate: float, floor: int,
                    warmup: int, window: float, resize_from: TrialOutcome | None) -> tuple[int, int, str]:
    """The window of an open loop spans the measured arrivals: ``rate x window`` of them, after a warm-up
    that fills the pipeline (``rate x E2E`` requests in flight: Little's law), and enough of them to
    complete ``completions_per_stream`` per request in flight."""
    rules = plan.validation.rules()
    turns = turns_per_unit(plan)  # a level is sessions/s; a session lasts its turns' latencies
    e2e, how = _e2e_estimate(state, flags, rate)
    in_flight = rate * e2e * turns if e2e else 0.0  # units (requests, or sessions) in flight
    window = max(window, WINDOW_E2E * (e2e or 0.0) * turns)  # a window of a few latencies, or no steady state shows
    warmup = max(warmup, math.ceil(in_flight * WARMUP_FILL) * turns)
    by_time = math.ceil(rate * window * SAFETY) * turns
    needed = math.ceil(rules.completions_needed(in_flight) * SAFETY + in_flight) * turns
    requests = max(floor, needed, by_time)
    parts = [f"floor {floor}", f"{window:g} s at {rate:g} {'sessions' if turns > 1 else 'req'}/s",
             f"{how}: {in_flight:.0f} in flight, warm-up {warmup}"
             + (f"; {turns} requests per session" if turns > 1 else "")]
    if resize_from is not None:
        requests = max(requests, math.ceil(resize_from.requests * RESIZE))
        parts.append(f"re-sized from the INVALID trial {resize_from.trial_id[:8]}")
    cap = plan.budget.max_requests_per_trial
    if requests > cap:
        parts.append(f"capped at budget.max_requests_per_trial {cap}")
        requests = cap
    return requests, warmup, "; ".join(parts)
