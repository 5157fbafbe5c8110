"""Is a trial a measurement of the load it states? The steady window, the in-flight level, the rules.

MLPerf LoadGen's model: a result counts only with a minimum duration, a minimum number of
queries and the stated scenario actually held. Here the scenario is the load mode:

* closed loop (``concurrency`` streams): the steady window opens once every stream is busy and
  the first ``concurrency`` requests of the run have finished (one turnover, so the synchronised
  start-up burst is left out) and closes at the last dispatch (after it, streams fall idle);
* open loop (``rate``): the window spans the measured arrivals, first to last; the drain after the
  last arrival is left out;
* waves (``waves``, static batching of B): from the first measured send to the last measured end,
  every wave whole (each one drains by design, so there is no in-flight rule).

Every figure of the summary is computed over that one window and the requests that completed in
it (servetune.metrics). ``assess`` then applies ``ValidityRules``: window length, completions,
in-flight level (closed loop) or dispatch schedule (open loop), and the agreement of the tokens
that arrived in the window with those of the requests completed in it (they differ by the
requests straddling its edges; a closed loop locked into waves by fixed output lengths leaves
about ``streams / (2 x completions)`` of excess at its end, hence the 15% default). A trial failing any rule is
INVALID: kept, marked with its reasons, and never used for a decision.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from servetune.records import RequestRecord
from servetune.stats import quantile_interval

IN_FLIGHT_BINS = 20
MIN_BIN_S = 0.05


class ValidityRules(BaseModel):
    """What a trial needs to decide anything (defaults sized for a GPU; the same in virtual time)."""

    model_config = ConfigDict(extra="forbid")

    min_window_s: float = Field(default=20.0, ge=0, description="shortest steady window, seconds")
    min_completions: int = Field(default=200, ge=0, description="fewest requests completed inside the window")
    completions_per_stream: float = Field(
        default=4.0, ge=0, description="... and at least this many per stream (closed loop) or per request in flight"
    )
    min_in_flight: float = Field(
        default=0.9, ge=0, le=1, description="closed loop: in-flight requests, mean and every bin, over the streams"
    )
    min_dispatch_fraction: float = Field(
        default=0.95, ge=0, le=1, description="open loop: dispatch rate over the scheduled arrival rate"
    )
    max_throughput_mismatch: float = Field(
        default=0.15, ge=0,
        description="|tokens arriving in the window / tokens of the requests completed in it - 1|",
    )
    max_latency_growth: float = Field(
        default=1.5, gt=1,
        description="open loop: median E2E per output token of the window's last quarter of arrivals over its"
                    " second; above it the backlog is growing: not sustained")
    min_completion_fraction: float = Field(
        default=0.95, ge=0, le=1,
        description="open loop: completions (in the window shifted by the median E2E) over arrivals to count as"
                    " sustained"
    )
    max_client_lag_ms: float = Field(
        default=25.0, gt=0,
        description="the client's event loop, p99 lateness over the window (loadgen.lag): above it the client stamps"
                    " TTFT and ITL too late to referee them")

    def completions_needed(self, level: float | None) -> int:
        """max(min_completions, completions_per_stream x level)."""
        return max(self.min_completions, math.ceil(self.completions_per_stream * (level or 0.0)))


@dataclass(frozen=True)
class SteadyWindow:
    start_s: float | None
    end_s: float | None
    kind: str  # closed_loop | open_loop | waves
    reason: str | None = None  # why there is none

    @property
    def exists(self) -> bool:
        return self.start_s is not None and self.end_s is not None and self.end_s > self.start_s

    @property
    def length_s(self) -> float:
        return (self.end_s - self.start_s) if self.exists else 0.0  # type: ignore[operator]


def _end_s(r: RequestRecord) -> float | None:
    return None if r.e2e_ms is None else r.t_send_s + r.e2e_ms / 1000.0


def load_mode(load: dict[str, Any] | None) -> tuple[str, int | None, float | None]:
    """(mode, concurrency, offered rate) from a result's ``load`` section."""
    load = load or {}
    mode = str(load.get("mode") or "concurrency")
    conc = load.get("concurrency")
    rate = load.get("rate")
    return mode, (int(conc) if conc is not None else None), (float(rate) if rate is not None else None)


def steady_window(records: Sequence[RequestRecord], load: dict[str, Any] | None) -> SteadyWindow:
    """The span during which the offered load was held (warm-up turnover and drain left out)."""
    mode, conc, _rate = load_mode(load)
    measured = [r for r in records if not r.warmup]
    if not measured:
        return SteadyWindow(None, None, "open_loop" if mode == "rate" else "closed_loop", "no measured request")
    first_measured = min(r.t_send_s for r in measured)
    # a user's session is one unit of load: it arrives (or takes a stream) at its first turn's send
    has_sessions = any(r.session >= 0 for r in records)
    starts, unit_ends, unit_measured = _unit_spans(records) if has_sessions else ([], [], [])
    if mode == "rate":
        last = (max((a for a, m in zip(starts, unit_measured, strict=True) if m), default=first_measured)
                if has_sessions else max(r.t_send_s for r in measured))
        if last <= first_measured:
            return SteadyWindow(None, None, "open_loop", "fewer than two measured arrivals")
        return SteadyWindow(first_measured, last, "open_loop")
    if mode == "waves":  # every wave is the same load: the first measured send to the last measured end
        last_end = max((e for r in measured if (e := _end_s(r)) is not None), default=None)
        if last_end is None or last_end <= first_measured:
            return SteadyWindow(None, None, "waves", "no measured request finished")
        return SteadyWindow(first_measured, last_end, "waves")
    streams = min(conc or 1, len(records))
    if has_sessions:
        ends, last_dispatch = sorted(unit_ends), max(starts, default=0.0)
    else:
        ends = sorted(e for r in records if (e := _end_s(r)) is not None)
        last_dispatch = max(r.t_send_s for r in records)
    if len(ends) < streams:
        return SteadyWindow(None, None, "closed_loop", f"fewer than {streams} requests finished")
    start = max(first_measured, ends[streams - 1])
    if last_dispatch <= start:
        total = len(records)
        return SteadyWindow(None, None, "closed_loop",
                            f"the last request was dispatched before the first {streams} had finished"
                            f" ({total} requests at concurrency {conc}): the run never left its start-up burst")
    return SteadyWindow(start, last_dispatch, "closed_loop")


def _unit_spans(records: Sequence[RequestRecord]) -> tuple[list[float], list[float], list[bool]]:
    """(starts, ends, measured) of the load's finished units: a request, or a user's session from its
    first turn's send to its last turn's end (think time included: the user holds the stream meanwhile);
    a unit is measured when its first request is not warm-up."""
    starts: list[float] = []
    ends: list[float] = []
    measured: list[bool] = []
    sessions: dict[int, list] = {}
    for r in records:
        e = _end_s(r)
        if e is None:
            continue
        if r.session < 0:
            starts.append(r.t_send_s)
            ends.append(e)
            measured.append(not r.warmup)
        elif (span := sessions.get(r.session)) is None:
            sessions[r.session] = [r.t_send_s, e, not r.warmup]
        else:
            if r.t_send_s < span[0]:
                span[0], span[2] = r.t_send_s, not r.warmup
            span[1] = max(span[1], e)
    for a, b, m in sessions.values():
        starts.append(a)
        ends.append(b)
        measured.append(m)
    return starts, ends, measured


def in_flight(records: Sequence[RequestRecord], start: float, end: float) -> tuple[float, float]:
    """(time-weighted mean, lowest bin mean) of units in flight over [start, end], every record counted:
    requests, or users' sessions (multi-turn ``sessions``: one per user, between turns too).

    The window is cut into up to 20 bins of at least 50 ms; a client that cannot hold its load
    shows as a low bin even when the mean hides it.
    """
    starts, finishes, _ = _unit_spans(records)
    sends = np.asarray(starts, dtype=np.float64)
    ends = np.asarray(finishes, dtype=np.float64)
    times = np.concatenate([sends, ends])
    steps = np.concatenate([np.ones(sends.size), -np.ones(ends.size)])
    order = np.argsort(times, kind="stable")
    times, level = times[order], np.cumsum(steps[order])
    # F(t) = integral of the level from the first event to t; the level is constant between events
    area = np.concatenate([[0.0], np.cumsum(level[:-1] * np.diff(times))]) if times.size else np.zeros(0)

    def integral(t: np.ndarray) -> np.ndarray:
        if times.size == 0:
            return np.zeros_like(t)
        i = np.searchsorted(times, t, side="right") - 1
        inside = i >= 0
        j = np.clip(i, 0, None)
        return np.where(inside, area[j] + level[j] * (t - times[j]), 0.0)

    span = end - start
    if span <= 0:
        return 0.0, 0.0
    n_bins = max(1, min(IN_FLIGHT_BINS, int(span / MIN_BIN_S)))
    edges = np.linspace(start, end, n_bins + 1)
    f = integral(edges)
    bins = np.diff(f) / np.diff(edges)
    return float((f[-1] - f[0]) / span), float(bins.min())


class Assessment(BaseModel):
    """The validity figures of one trial, as stored in its summary."""

    model_config = ConfigDict(extra="forbid")

    valid: bool
    reasons: list[str] = []
    completions_needed: int = 0
    in_flight_target: float | None = None
    in_flight_mean: float | None = None
    in_flight_min: float | None = None
    dispatch_fraction: float | None = None
    scheduled_rate: float | None = None
    completion_fraction: float | None = None
    latency_growth: float | None = None
    latency_growth_interval: tuple[float, float] | None = None
    sustained: bool | None = None
    throughput_mismatch: float | None = None
    client_lag_p99_ms: float | None = None


def assess(
    records: Sequence[RequestRecord],
    window: SteadyWindow,
    load: dict[str, Any] | None,
    rules: ValidityRules,
    *,
    completions: int,
    arrived_tokens_per_s: float | None,
    completed_tokens_per_s: float | None,
) -> Assessment:
    """Apply the rules to a trial whose window and in-window figures are already known."""
    mode, conc, _ = load_mode(load)
    reasons: list[str] = []
    out = Assessment(valid=False)
    if not window.exists:
        out.reasons = [f"no steady window: {window.reason}"]
        out.completions_needed = rules.completions_needed(conc if mode != "rate" else 0)
        return out
    ws, we, span = window.start_s, window.end_s, window.length_s
    assert ws is not None and we is not None
    mean_in, min_in = in_flight(records, ws, we)
    out.in_flight_mean, out.in_flight_min = mean_in, min_in
    level = float(conc or 0) if mode != "rate" else mean_in
    out.completions_needed = needed = rules.completions_needed(level)
    if span < rules.min_window_s:
        reasons.append(f"steady window {span:.1f} s < {rules.min_window_s:g} s")
    if completions < needed:
        basis = f"{rules.completions_per_stream:g} x {level:.0f} {'streams' if mode != 'rate' else 'in flight'}"
        reasons.append(f"{completions} requests completed in the window < {needed} needed"
                       f" (max({rules.min_completions}, {basis}))")
    lag = (load or {}).get("client_lag_p99_ms")
    out.client_lag_p99_ms = lag
    if lag is not None and lag > rules.max_client_lag_ms:
        reasons.append(f"the client's event loop woke p99 {lag:.1f} ms late over the window"
                       f" > {rules.max_client_lag_ms:g} ms: its TTFT and ITL stamps are late by as much")
    if mode == "waves":
        pass  # a wave drains to its longest request by design: no in-flight rule
    elif mode != "rate":
        out.in_flight_target = target = float(conc or 0)
        floor = rules.min_in_flight * target
        if mean_in < floor or min_in < floor:
            reasons.append(f"in flight {mean_in:.1f} on average (lowest {min_in:.1f}) of {target:.0f} streams"
                           f" < {rules.min_in_flight:.0%}: the client did not hold the load")
    else:
        _open_loop(records, ws, we, rules, out, reasons, cap=conc)
    if arrived_tokens_per_s is not None and completed_tokens_per_s:
        out.throughput_mismatch = mismatch = arrived_tokens_per_s / completed_tokens_per_s - 1.0
        if abs(mismatch) > rules.max_throughput_mismatch:
            reasons.append(f"{arrived_tokens_per_s:.1f} output tokens/s arrived in the window against"
                           f" {completed_tokens_per_s:.1f} from the requests completed in it ({mismatch:+.1%},"
                           f" limit ±{rules.max_throughput_mismatch:.0%}): the window is not in a steady state")
    out.reasons, out.valid = reasons, not reasons
    return out


CAP_BOUND = 0.9  # in flight on average at this share of the cap: the cap, not the client, held the dispatch


def cap_full(in_flight_mean: float | None, cap: int | None) -> bool:
    """An open loop's in-flight cap stayed (nearly) full: late dispatches are the server's backlog."""
    return bool(cap) and (in_flight_mean or 0.0) >= CAP_BOUND * cap  # type: ignore[operator]


def _open_loop(records: Sequence[RequestRecord], ws: float, we: float, rules: ValidityRules,
               out: Assessment, reasons: list[str], *, cap: int | None) -> None:
    """Open loop: did the client keep to its schedule, and did the server keep up (sustained)?"""
    measured = [r for r in records if not r.warmup]
    due = np.sort(np.fromiter((r.t_send_s - r.queue_ms / 1000.0 for r in measured), dtype=np.float64))
    sent = np.fromiter((r.t_send_s for r in measured if ws <= r.t_send_s <= we), dtype=np.float64)
    span = we - ws
    scheduled_span = float(due[-1] - due[0]) if due.size > 1 else 0.0
    if scheduled_span > 0 and sent.size > 1:
        out.scheduled_rate = (due.size - 1) / scheduled_span
        achieved = (sent.size - 1) / span
        out.dispatch_fraction = frac = achieved / out.scheduled_rate
        if frac < rules.min_dispatch_fraction and cap_full(out.in_flight_mean, cap):
            reasons.append(f"dispatched at {frac:.0%} of the scheduled rate ({achieved:.2f} of"
                           f" {out.scheduled_rate:.2f} req/s) with {out.in_flight_mean:.0f} of at most {cap} in"
                           " flight: the cap held arrivals back because the server did not finish them")
        elif frac < rules.min_dispatch_fraction:
            reasons.append(f"the client dispatched at {frac:.0%} of its scheduled rate"
                           f" ({achieved:.2f} of {out.scheduled_rate:.2f} req/s) < {rules.min_dispatch_fraction:.0%}:"
                           " it could not hold the load")
    if sent.size:
        out.completion_fraction = _completion_fraction(records, ws, we, sent.size)
        out.latency_growth, out.latency_growth_interval = _latency_growth(records, ws, we)
        growing = out.latency_growth is not None and out.latency_growth > rules.max_latency_growth
        held_back = (out.dispatch_fraction or 1.0) < rules.min_dispatch_fraction and cap_full(out.in_flight_mean, cap)
        # the latency trend decides when it can be read; the completion count one latency later is the
        # fallback (it swings with where a burst of arrivals falls against the window's edges)
        keeps_up = out.completion_fraction >= rules.min_completion_fraction if out.latency_growth is None \
            else not growing
        out.sustained = keeps_up and not held_back


def _latency_growth(records: Sequence[RequestRecord], ws: float,
                    we: float) -> tuple[float | None, tuple[float, float] | None]:
    """(median E2E per output token of the window's last quarter of arrivals / of its second, its 95% interval).

    A server short of the offered rate accumulates the excess, queued or in ever larger batches
    that each run slower: either way a later arrival takes longer per token than an earlier one,
    where a sustained load keeps it level. Per output token, so the lengths drawn do not move it;
    the second quarter, not the first, so a warm-up still filling the pipeline does not; latency,
    not the in-flight count, so a lull in the arrivals (a Poisson draw's quiet spell) does not.
    The interval (each median's order-statistic interval, the ratio of their far ends) says how far a
    verdict near the limit can be trusted: a few hundred arrivals per quarter leave it wide."""
    quarter = (we - ws) / 4

    def per_token(lo: float, hi: float) -> list[float]:
        return [r.e2e_ms / r.completion_tokens for r in records  # type: ignore[operator]
                if not r.warmup and r.ok and r.e2e_ms and r.completion_tokens and lo <= r.t_send_s <= hi]

    early, late = per_token(ws + quarter, ws + 2 * quarter), per_token(we - quarter, we)
    if len(early) < 5 or len(late) < 5:
        return None, None
    growth = float(np.median(late)) / float(np.median(early))
    (early_lo, early_hi), (late_lo, late_hi) = quantile_interval(early, 0.5), quantile_interval(late, 0.5)  # type: ignore[misc]
    return growth, (late_lo / early_hi, late_hi / early_lo)


def _completion_fraction(records: Sequence[RequestRecord], ws: float, we: float, arrivals: int) -> float:
    """Completions over the window shifted by the median E2E, over the arrivals in the window.

    A server that keeps up completes what arrives, one latency later: counting completions in the
    unshifted window would charge a sustained load with the requests still in flight at its end
    (about rate x E2E of them) and call a server at half its capacity overloaded on a short window.
    Overloaded, completions run at the server's capacity whatever the shift, below the arrivals."""
    done = [r for r in records if r.ok and r.e2e_ms is not None]
    lag = float(np.median([r.e2e_ms for r in done if not r.warmup] or [0.0])) / 1000.0
    ends = np.fromiter((r.t_send_s + r.e2e_ms / 1000.0 for r in done), dtype=np.float64)  # type: ignore[operator]
    return float(np.count_nonzero((ends >= ws + lag) & (ends <= we + lag))) / arrivals
