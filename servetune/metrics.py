"""Records + telemetry -> TrialSummary: every figure a result must state, one definition each.

The definitions are pinned in docs/metrics.md because peer load generators (vLLM's, SGLang's, guidellm,
aiperf) disagree on them: ITL is per token (a chunk of k tokens gives k gaps), TPOT is
(E2E - TTFT) / (out - 1) from server usage, throughput is counted over a stated window, and an
unknown figure is ``None``, never 0.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import chain
from typing import Any

import numpy as np

from servetune.energy import Cost, apply_energy
from servetune.gpu_summary import summarize_gpu
from servetune.multimodal import summarize_images
from servetune.per_turn import by_turn
from servetune.records import RequestRecord
from servetune.result import Percentiles, TrialSummary
from servetune.sla import SLA
from servetune.stats import quantile_interval
from servetune.validity import SteadyWindow, ValidityRules, assess, load_mode, steady_window

log = logging.getLogger(__name__)

PERCENTILE_METHOD = "linear"  # numpy's default: interpolate between the two nearest ranks


def percentiles(values: Iterable[float] | np.ndarray) -> Percentiles:
    """p50/p90/p95/p99/max/mean/min with numpy's linear interpolation; empty -> count 0, all None."""
    if isinstance(values, np.ndarray):
        arr = values.astype(np.float64, copy=False)
    else:
        arr = np.fromiter((float(v) for v in values), dtype=np.float64)
    if arr.size == 0:
        return Percentiles()
    p50, p90, p95, p99 = np.percentile(arr, [50, 90, 95, 99], method=PERCENTILE_METHOD)
    return Percentiles(
        count=int(arr.size),
        mean=float(arr.mean()),
        p50=float(p50),
        p90=float(p90),
        p95=float(p95),
        p99=float(p99),
        max=float(arr.max()),
        min=float(arr.min()),
    )


def summarize(
    records: Sequence[RequestRecord],
    *,
    load: dict[str, Any] | None,
    sla: SLA | None,
    gpu: dict[str, Any] | None,
    server: dict[str, Any] | None,
    lengths_exact: bool,
    rules: ValidityRules | None = None,
    window: tuple[float, float] | None = None,
    cost: Cost | None = None,
) -> TrialSummary:
    """Compute the TrialSummary of one trial (definitions: docs/metrics.md).

    One window for everything: the steady window of ``load`` (servetune.validity) unless the caller
    states one; latencies, throughput and goodput all come from the measured requests that
    completed inside it. Without a steady window the figures span first send .. last end and the
    trial is INVALID.
    """
    rules = rules or ValidityRules()
    measured = [r for r in records if not r.warmup]
    ok_all = [r for r in measured if r.ok]
    failed = [r for r in measured if not r.ok]

    s = TrialSummary(
        requests_total=len(records),
        requests_measured=len(measured),
        requests_warmup=len(records) - len(measured),
        requests_ok=len(ok_all),
        requests_failed=len(failed),
        error_rate=len(failed) / len(measured) if measured else 0.0,
        errors_by_class=dict(Counter(str(r.error_class) for r in failed)),
        lengths_exact=lengths_exact,
        token_count_sources=dict(Counter(r.token_count_source for r in ok_all if r.token_count_source)),
        validity_rules=rules.model_dump(),
    )
    mode, conc, rate = load_mode(load)
    s.scenario = {"rate": "open_loop", "waves": "waves"}.get(mode, "closed_loop")
    s.offered_concurrency, s.offered_rate = conc, rate

    steady = steady_window(records, load) if window is None else SteadyWindow(*window, kind="stated")
    if steady.exists and not any(steady.start_s < e <= steady.end_s  # type: ignore[operator]
                                 for r in measured if (e := _end_s(r)) is not None):
        steady = SteadyWindow(None, None, steady.kind, "no measured request completed inside it")
    ws: float | None = None
    we: float | None = None
    if steady.exists:
        kind = "waves" if steady.kind == "waves" else "steady"  # a static batch fills and drains: never steady
        ws, we, source = steady.start_s, steady.end_s, kind if window is None else "stated"
    else:
        span = _whole_span(measured)
        if span:
            ws, we = span
        source = "no_steady_window"
    # closed loop: what completed in (start, end] (the completion that opens it belongs to the turnover);
    # open loop: what arrived in it, whenever it ends (what completed in it misses the last E2E's arrivals)
    arrivals = steady.exists and steady.kind == "open_loop"
    in_set = [r for r in measured if ws is not None and we is not None and (e := _end_s(r)) is not None
              and (ws <= r.t_send_s <= we if arrivals else ws < e <= we)]
    ok = [r for r in in_set if r.ok]
    s.completions_in_window = len(in_set)

    # latency distributions over the successful requests that completed in the window
    bounded = {"ttft": [r.ttft_ms for r in ok if r.ttft_ms is not None],  # what an SLA's p99 can bound
               "tpot": [t for r in ok if (t := r.tpot_ms()) is not None],
               "e2e": [r.e2e_ms for r in ok if r.e2e_ms is not None]}
    s.ttft_ms, s.tpot_ms, s.e2e_ms = (percentiles(bounded[k]) for k in ("ttft", "tpot", "e2e"))
    s.itl_ms = percentiles(Chunks.of(ok).itl_gaps_ms())
    s.p99_interval_ms = {k: list(ci) for k, v in bounded.items() if (ci := quantile_interval(v)) is not None}
    s.queue_ms = percentiles(r.queue_ms for r in ok)
    # lengths as the server counted them (usage); requested lengths stay in the records
    s.input_len = percentiles(r.prompt_tokens for r in ok if r.prompt_tokens is not None)
    s.output_len = percentiles(r.completion_tokens for r in ok if r.completion_tokens is not None)
    s.cached_len = percentiles(r.cached_tokens for r in ok if r.cached_tokens is not None)

    if sla is not None:
        s.sla = sla.request_bounds()
    if ws is not None and we is not None and we > ws:
        s.window_start_s, s.window_end_s, s.window_s, s.window_source = ws, we, we - ws, source
        # an open loop's set runs on past the window by its last E2E; the tokens the warm-up's requests stream
        # into the window's start make up for it, so they count among the tokens that arrived in it
        streamed = [r for r in records if r.ok] if arrivals else ok_all
        _throughput(s, streamed, ok, ws, we)
        _goodput(s, in_set, ok, sla)
    s.prefix_hit_rate = prefix_hit_rate(measured)
    s.by_turn = by_turn(ok)
    _validity(s, records, steady, load, rules)
    s.multimodal = summarize_images(ok, _server_signals(s, server))
    summarize_gpu(s, gpu)
    apply_energy(s, gpu, cost)
    return s


# --- throughput ---------------------------------------------------------------------------


def _end_s(r: RequestRecord) -> float | None:
    return None if r.e2e_ms is None else r.t_send_s + r.e2e_ms / 1000.0


def _first_token_s(r: RequestRecord) -> float | None:
    return None if r.ttft_ms is None else r.t_send_s + r.ttft_ms / 1000.0


def _whole_span(measured: Sequence[RequestRecord]) -> tuple[float, float] | None:
    """First measured send .. last measured end: what a trial without a steady window spans."""
    sends = [r.t_send_s for r in measured]
    ends = [e for r in measured if (e := _end_s(r)) is not None]
    if not sends or not ends or max(ends) <= min(sends):
        return None
    return min(sends), max(ends)


class Chunks:
    """Every content chunk of a set of records as flat arrays: one pass in Python, the rest numpy.

    A trial can hold a million records of hundreds of chunks; per-chunk Python loops would make
    the summary the slowest step of a trial.
    """

    def __init__(self, t_s: np.ndarray, offsets_ms: np.ndarray, tokens: np.ndarray, first: np.ndarray):
        self.t_s = t_s  # arrival, seconds after t0
        self.offsets_ms = offsets_ms  # arrival, ms after the request's own t_send
        self.tokens = tokens  # tokens carried (a chunk without a count carries one)
        self.first = first  # the request's first content chunk

    @classmethod
    def of(cls, records: Sequence[RequestRecord]) -> Chunks:
        lens = np.fromiter((len(r.chunk_offsets_ms) for r in records), dtype=np.int64, count=len(records))
        total = int(lens.sum())
        offsets = np.fromiter(
            chain.from_iterable(r.chunk_offsets_ms for r in records), dtype=np.float64, count=total
        )
        tokens = np.fromiter(chain.from_iterable(map(_chunk_tokens, records)), dtype=np.int64, count=total)
        sends = np.fromiter((r.t_send_s for r in records), dtype=np.float64, count=len(records))
        first = np.zeros(total, dtype=bool)
        first[(np.cumsum(lens) - lens)[lens > 0]] = True
        return cls(np.repeat(sends, lens) + offsets / 1000.0, offsets, tokens, first)

    def itl_gaps_ms(self) -> np.ndarray:
        """Per-token gaps, as ``RequestRecord.itl_gaps_ms`` pooled over the records."""
        later = ~self.first[1:]  # a gap belongs to every chunk but a request's first
        gaps = np.diff(self.offsets_ms)[later]
        k = np.maximum(self.tokens[1:][later], 1)
        return np.repeat(gaps / k, k)

    def arrived_in_usage_units(self, records: Sequence[RequestRecord], start: float, end: float) -> float:
        """Output tokens that arrived in (start, end], each request's share scaled to its server-reported
        count: per-chunk counts from re-tokenised text are not the server's tokens (seen +20% on SGLang)."""
        if self.t_s.size == 0:
            return 0.0
        lens = np.fromiter((len(r.chunk_offsets_ms) for r in records), dtype=np.int64, count=len(records))
        owner = np.repeat(np.arange(len(records)), lens)
        tokens = np.maximum(self.tokens, 0).astype(np.float64)
        inside = (self.t_s > start) & (self.t_s <= end)
        total = np.bincount(owner, weights=tokens, minlength=len(records))
        within = np.bincount(owner[inside], weights=tokens[inside], minlength=len(records))
        usage = np.fromiter((r.output_tokens if r.output_tokens is not None else np.nan for r in records),
                            dtype=np.float64, count=len(records))
        scale = np.where(np.isfinite(usage) & (total > 0), usage / np.where(total > 0, total, 1.0), 1.0)
        return float((within * scale).sum())

    def in_window(self, start: float, end: float) -> tuple[int, int]:
        """(output tokens, decode tokens) of the chunks arriving in (start, end]."""
        inside = (self.t_s > start) & (self.t_s <= end)
        tokens = np.maximum(self.tokens[inside], 0)
        out = int(tokens.sum())
        return out, max(out - int(self.first[inside].sum()), 0)


def _chunk_tokens(r: RequestRecord) -> list[int]:
    """Tokens per content chunk, aligned with the offsets; a chunk without a count carries one."""
    toks, n = r.chunk_tokens, len(r.chunk_offsets_ms)
    if len(toks) == n:
        return toks
    return [toks[i] if i < len(toks) else 1 for i in range(n)]


def _output_tokens(r: RequestRecord) -> int:
    """Server usage, else the per-chunk counts, a chunk without a count carrying one token."""
    out = r.output_tokens
    return out if out is not None else sum(max(t, 0) for t in _chunk_tokens(r))


def _throughput(
    s: TrialSummary, streamed: Sequence[RequestRecord], ok: Sequence[RequestRecord], ws: float, we: float
) -> None:
    """Requests completed in the window and their tokens, over its length: one set for every rate.

    The tokens that merely arrived in the window (of ``streamed``, requests straddling its edges included) are
    kept beside it as ``output_tokens_per_s_arrived``: in a steady state the two agree."""
    span = we - ws
    outs = [_output_tokens(r) for r in ok]
    s.request_throughput = len(ok) / span
    s.output_tokens_per_s = sum(outs) / span
    s.decode_tokens_per_s = sum(max(o - 1, 0) for o in outs) / span  # each request's first token is prefill's
    s.output_tokens_per_s_arrived = Chunks.of(streamed).arrived_in_usage_units(streamed, ws, we) / span
    with_usage = [r for r in ok if r.prompt_tokens is not None]
    if with_usage:
        s.input_tokens_per_s = sum(r.prompt_tokens or 0 for r in with_usage) / span
        s.total_tokens_per_s = s.input_tokens_per_s + s.output_tokens_per_s


def _validity(s: TrialSummary, records: Sequence[RequestRecord], steady: SteadyWindow, load: dict[str, Any] | None,
              rules: ValidityRules) -> None:
    """The rules of servetune.validity on this summary's window and set."""
    if s.request_throughput and s.output_tokens_per_s is not None:
        s.tokens_per_request = s.output_tokens_per_s / s.request_throughput
    a = assess(records, steady, load, rules, completions=s.completions_in_window,
               arrived_tokens_per_s=s.output_tokens_per_s_arrived, completed_tokens_per_s=s.output_tokens_per_s)
    s.valid, s.invalid_reasons = a.valid, a.reasons
    s.completions_needed = a.completions_needed
    s.in_flight_target, s.in_flight_mean, s.in_flight_min = a.in_flight_target, a.in_flight_mean, a.in_flight_min
    s.in_flight_min_fraction = (a.in_flight_min / a.in_flight_target
                                if a.in_flight_min is not None and a.in_flight_target else None)
    s.dispatch_fraction, s.scheduled_rate = a.dispatch_fraction, a.scheduled_rate
    s.completion_fraction, s.sustained, s.latency_growth = a.completion_fraction, a.sustained, a.latency_growth
    s.latency_growth_interval = list(a.latency_growth_interval) if a.latency_growth_interval else None
    s.throughput_mismatch, s.client_lag_p99_ms = a.throughput_mismatch, a.client_lag_p99_ms


# --- goodput ------------------------------------------------------------------------------


def meets_bounds(r: RequestRecord, bounds: dict[str, float]) -> bool:
    """Succeeded and met every per-request bound; a request with <2 output tokens has no TPOT to miss."""
    if not r.ok:
        return False
    if "ttft_ms" in bounds and (r.ttft_ms is None or r.ttft_ms > bounds["ttft_ms"]):
        return False
    if "e2e_ms" in bounds and (r.e2e_ms is None or r.e2e_ms > bounds["e2e_ms"]):
        return False
    if "tpot_ms" in bounds:
        tpot = r.tpot_ms()
        if tpot is not None and tpot > bounds["tpot_ms"]:
            return False
        if tpot is None and (r.output_tokens or 0) >= 2:  # a decode phase we could not time
            return False
    return True


def _goodput(s: TrialSummary, in_set: Sequence[RequestRecord], ok: Sequence[RequestRecord], sla: SLA | None) -> None:
    """The window's requests that met every per-request bound, over the same window."""
    if sla is None:
        return
    good = sum(1 for r in ok if meets_bounds(r, s.sla))
    if in_set:
        s.goodput_fraction = good / len(in_set)
    if s.window_s:
        s.goodput_rps = good / s.window_s


# --- prefix cache -------------------------------------------------------------------------


def prefix_hit_rate(measured: Sequence[RequestRecord]) -> float | None:
    """sum(cached)/sum(prompt) over measured requests whose usage reported both; None if none did."""
    both = [(r.cached_tokens, r.prompt_tokens) for r in measured
            if r.cached_tokens is not None and r.prompt_tokens is not None]
    prompt = sum(p for _, p in both)
    return sum(c for c, _ in both) / prompt if prompt else None


def _server_signals(s: TrialSummary, server: dict[str, Any] | None) -> dict[str, Any] | None:
    if not server:
        return None
    if server.get("scheduler_log"):
        from servetune.telemetry.scheduler_log import signals

        for k, v in signals(server["scheduler_log"]).items():
            setattr(s, k, v)
    from servetune.telemetry.prometheus import derive_signals

    window = (s.window_start_s, s.window_end_s) if s.window_start_s is not None else None
    sig = derive_signals(server, window=window)  # type: ignore[arg-type]
    s.prefix_hit_rate_server = sig.get("prefix_hit_rate_server")
    s.cache_hit_rate_gauge = sig.get("cache_hit_rate_gauge")
    s.server_token_usage_max = sig.get("token_usage_max")
    s.server_queue_reqs_max = sig.get("queue_reqs_max")
    s.server_queue_reqs_mean = sig.get("queue_reqs_mean")
    s.server_running_reqs_mean = sig.get("running_reqs_mean")
    s.server_retractions = sig.get("retractions")
    s.server_samples = int(sig.get("samples") or 0)
    s.server_samples_in_window = int(sig.get("samples_in_window") or 0)
    return sig
