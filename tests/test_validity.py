"""The validity rules on hand-built record sets whose answer is known, and on the simulator in virtual time."""

from __future__ import annotations

import pytest

from servetune.loadgen import LoadConfig
from servetune.metrics import summarize
from servetune.records import RequestRecord
from servetune.sim.virtual import simulate
from servetune.sla import SLA
from servetune.validity import ValidityRules, in_flight, steady_window
from servetune.workload import build_requests
from servetune.workload.spec import WorkloadSpec

approx = pytest.approx
RULES = ValidityRules(min_window_s=5.0, min_completions=50)


def _req(i: int, send: float, e2e_s: float, out: int = 10, *, warmup: bool = False, queue_ms: float = 0.0,
         ttft_s: float = 0.05) -> RequestRecord:
    """A successful request with ``out`` tokens spread evenly after its first token."""
    step = (e2e_s - ttft_s) / max(out - 1, 1)
    offsets = [1000.0 * (ttft_s + k * step) for k in range(out)]
    return RequestRecord(request_id=i, t_send_s=send, queue_ms=queue_ms, ttft_ms=ttft_s * 1000, e2e_ms=e2e_s * 1000,
                         chunk_offsets_ms=offsets, chunk_tokens=[1] * out, prompt_tokens=100, completion_tokens=out,
                         warmup=warmup)


def closed_loop(n: int, streams: int, e2e_s: float, *, gap_s: float = 0.0, warmup: int = 0) -> list[RequestRecord]:
    """``streams`` streams, each sending its next request ``gap_s`` after the previous one ends."""
    recs: list[RequestRecord] = []
    free = [0.0] * streams
    for i in range(n):
        k = min(range(streams), key=lambda j: free[j])
        send = free[k]
        recs.append(_req(i, send, e2e_s, warmup=i < warmup))
        free[k] = send + e2e_s + gap_s
    return recs


def load(c: int, **kw) -> dict:
    return {"mode": "concurrency", "concurrency": c, **kw}


def test_a_healthy_closed_loop_is_valid_and_its_figures_agree() -> None:
    recs = closed_loop(400, 8, 1.0, warmup=8)  # 8 streams, 1 s per request: 8 req/s for 50 s
    s = summarize(recs, load=load(8), rules=RULES, sla=SLA(ttft_ms=1000), gpu=None, server=None, lengths_exact=True)
    assert s.valid is True and s.invalid_reasons == [] and s.window_source == "steady"
    assert s.window_start_s == approx(1.0)  # the 8th completion: one turnover
    assert s.window_end_s == approx(49.0)  # the last dispatch
    assert s.in_flight_mean == approx(8.0) and s.in_flight_min == approx(8.0)
    assert s.request_throughput == approx(8.0, rel=0.03)
    assert s.goodput_rps is not None and s.goodput_rps <= s.request_throughput
    assert s.tokens_per_request == approx(s.output_len.mean)  # one set for requests/s and tokens/s
    assert abs(s.throughput_mismatch) < 0.05  # what arrived in the window agrees: a steady state


def test_a_transient_only_trial_has_no_steady_window() -> None:
    """Concurrency close to the request count: every request leaves in the start-up burst."""
    recs = closed_loop(160, 128, 2.0)
    s = summarize(recs, load=load(128), rules=RULES, sla=None, gpu=None, server=None, lengths_exact=True)
    assert s.valid is False and s.window_source == "no_steady_window"
    assert "no steady window" in s.invalid_reasons[0] and "start-up burst" in s.invalid_reasons[0]
    w = steady_window(recs, load(128))
    assert not w.exists


def test_too_short_and_too_few_completions_are_named() -> None:
    recs = closed_loop(40, 4, 0.5)  # about 4.5 s of steady window, 32 completions
    s = summarize(recs, load=load(4), rules=RULES, sla=None, gpu=None, server=None, lengths_exact=True)
    assert s.valid is False
    assert any(r.startswith("steady window") and "< 5 s" in r for r in s.invalid_reasons)
    assert any("completed in the window < 50 needed" in r for r in s.invalid_reasons)


def test_per_stream_completions_scale_the_floor() -> None:
    rules = ValidityRules(min_window_s=1.0, min_completions=10, completions_per_stream=4)
    assert rules.completions_needed(128) == 512 and rules.completions_needed(1) == 10


def test_a_starved_client_is_invalid() -> None:
    """The client leaves 0.5 s between a stream's requests: it holds 2/3 of its 12 streams."""
    recs = closed_loop(600, 12, 1.0, gap_s=0.5)
    s = summarize(recs, load=load(12), rules=RULES, sla=None, gpu=None, server=None, lengths_exact=True)
    assert s.in_flight_mean == approx(8.0, rel=0.05)
    assert s.valid is False
    assert any("did not hold the load" in r for r in s.invalid_reasons)
    assert s.in_flight_min_fraction is not None and s.in_flight_min_fraction < 0.9


def test_in_flight_bins_catch_a_stall_the_mean_hides() -> None:
    recs = [_req(i, float(i), 1.0) for i in range(100)]  # one request in flight at any time for 100 s
    mean, lowest = in_flight(recs, 0.0, 100.0)
    assert mean == approx(1.0) and lowest == approx(1.0)
    stalled = [r for r in recs if not 40 <= r.t_send_s < 46]  # a 6 s hole
    mean, lowest = in_flight(stalled, 0.0, 100.0)
    assert mean == approx(0.94) and lowest < 0.5


def open_loop(n: int, rate: float, e2e_s: float, *, lag_per_request_s: float = 0.0) -> list[RequestRecord]:
    """Arrivals due every 1/rate s; each dispatched ``lag`` later than the last (a client falling behind)."""
    recs = []
    for i in range(n):
        due = i / rate
        lag = lag_per_request_s * i
        recs.append(_req(i, due + lag, e2e_s, queue_ms=lag * 1000))
    return recs


def test_an_open_loop_on_schedule_is_valid_and_sustained() -> None:
    recs = open_loop(400, 10.0, 0.8)
    s = summarize(recs, load={"mode": "rate", "rate": 10.0, "concurrency": 64}, rules=RULES, sla=None, gpu=None,
                  server=None, lengths_exact=True)
    assert s.valid is True and s.scenario == "open_loop"
    assert s.window_start_s == approx(0.0) and s.window_end_s == approx(39.9)  # the arrivals, not the drain
    assert s.dispatch_fraction == approx(1.0) and s.sustained is True
    assert s.request_throughput == approx(10.0, rel=0.03)  # the offered rate: the drain is left out
    assert s.in_flight_mean == approx(8.0, rel=0.05)  # Little's law: 10 req/s x 0.8 s


def test_an_open_loop_whose_client_falls_behind_is_invalid() -> None:
    recs = open_loop(400, 10.0, 0.8, lag_per_request_s=0.02)  # 20 ms later with every arrival
    s = summarize(recs, load={"mode": "rate", "rate": 10.0, "concurrency": 64}, rules=RULES, sla=None, gpu=None,
                  server=None, lengths_exact=True)
    assert s.dispatch_fraction == approx(1 / 1.2, rel=0.01)
    assert s.valid is False and any("of its scheduled rate" in r for r in s.invalid_reasons)


def test_an_open_loop_the_server_cannot_keep_up_with_is_not_sustained() -> None:
    # arrivals at 10 req/s, requests taking ever longer: the queue grows, completions lag arrivals
    recs = [_req(i, i / 10.0, 0.5 + 0.05 * i) for i in range(400)]
    s = summarize(recs, load={"mode": "rate", "rate": 10.0, "concurrency": 1000}, rules=RULES, sla=None, gpu=None,
                  server=None, lengths_exact=True)
    assert s.sustained is False and s.completion_fraction is not None and s.completion_fraction < 0.95


WORK = WorkloadSpec.model_validate({"name": "v", "seed": 2, "input": {"kind": "fixed", "value": 512},
                                    "output": {"kind": "fixed", "value": 128}})


def test_virtual_time_applies_the_same_rules() -> None:
    """The same c=128 / 160-request trial is INVALID in the simulator too; enough requests make it VALID."""
    args = {"model_profile": "llama-3.1-8b", "gpu_profile": "A100-80G"}
    short = simulate(args, build_requests(WORK, 176).requests, LoadConfig(concurrency=128, warmup_requests=16))
    assert short.summary.valid is False
    sized = simulate(args, build_requests(WORK, 2016).requests, LoadConfig(concurrency=128, warmup_requests=16))
    s = sized.summary
    assert s.valid is True, s.invalid_reasons
    assert s.window_s >= 20 and s.completions_in_window >= 512
    assert abs(s.throughput_mismatch) <= 0.15 and s.in_flight_min == approx(128.0)


def test_arrived_tokens_are_counted_in_the_servers_units() -> None:
    """A client that re-tokenises chunk text counts more tokens than the server generated (seen +20% on
    SGLang with a random model): the arrivals check scales each request's chunks to its usage count."""
    recs = closed_loop(400, 8, 1.0, warmup=8)
    for r in recs:
        r.chunk_tokens = [2] * len(r.chunk_tokens)  # 20 re-tokenised "tokens" for 10 generated ones
    s = summarize(recs, load=load(8), rules=RULES, sla=None, gpu=None, server=None, lengths_exact=True)
    assert s.output_tokens_per_s_arrived == approx(s.output_tokens_per_s, rel=0.05)
    assert s.valid is True
