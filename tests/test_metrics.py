"""summarize() on hand-built records whose answers are worked out by hand (docs/metrics.md)."""

from __future__ import annotations

import pytest

from servetune.gpu_summary import gpu_sweeps
from servetune.metrics import percentiles, prefix_hit_rate, summarize
from servetune.records import RequestRecord
from servetune.result import TrialResult
from servetune.sla import SLA

approx = pytest.approx


def _records() -> list[RequestRecord]:
    a = RequestRecord(  # measured, ok: 3 chunks carrying 1, 2, 3 tokens
        request_id=1,
        t_send_s=1.0,
        queue_ms=5.0,
        ttft_ms=100.0,
        e2e_ms=400.0,
        chunk_offsets_ms=[100.0, 200.0, 400.0],
        chunk_tokens=[1, 2, 3],
        token_count_source="meta_info",
        prompt_tokens=100,
        completion_tokens=6,
        cached_tokens=50,
    )
    b = RequestRecord(  # measured, ok; its last chunk arrives after the window closes
        request_id=2,
        t_send_s=1.5,
        queue_ms=15.0,
        ttft_ms=200.0,
        e2e_ms=600.0,
        chunk_offsets_ms=[200.0, 600.0],
        chunk_tokens=[1, 1],
        token_count_source="apportioned",
        prompt_tokens=200,
        completion_tokens=2,
        cached_tokens=0,
    )
    warm = RequestRecord(
        request_id=0,
        t_send_s=0.0,
        ttft_ms=50.0,
        e2e_ms=100.0,
        chunk_offsets_ms=[50.0, 100.0],
        chunk_tokens=[1, 1],
        prompt_tokens=1000,
        completion_tokens=2,
        cached_tokens=1000,
        warmup=True,
    )
    failed = RequestRecord(
        request_id=3,
        t_send_s=2.0,
        e2e_ms=300.0,
        error_class="timeout",
        error_message="read timeout",
    )
    return [warm, a, b, failed]


def test_percentiles_use_linear_interpolation():
    p = percentiles(range(1, 11))
    assert (p.count, p.min, p.max, p.mean) == (10, 1.0, 10.0, 5.5)
    assert (p.p50, p.p90, p.p95, p.p99) == approx((5.5, 9.1, 9.55, 9.91))
    empty = percentiles([])
    assert empty.count == 0 and empty.p50 is None and empty.mean is None


def test_counts_and_errors():
    s = summarize(_records(), load=None, window=(1.0, 2.0), sla=None, gpu=None, server=None, lengths_exact=True)
    assert (s.requests_total, s.requests_warmup, s.requests_measured) == (4, 1, 3)
    assert (s.requests_ok, s.requests_failed) == (2, 1)
    assert s.error_rate == approx(1 / 3)
    assert s.errors_by_class == {"timeout": 1}
    assert s.token_count_sources == {"meta_info": 1, "apportioned": 1}
    assert s.lengths_exact is True


def test_latency_distributions_exclude_warmup_and_failures():
    s = summarize(_records(), load=None, window=(1.0, 2.5), sla=None, gpu=None, server=None, lengths_exact=False)
    assert s.ttft_ms.count == 2 and s.ttft_ms.p50 == approx(150.0) and s.ttft_ms.p99 == approx(199.0)
    assert s.e2e_ms.min == 400.0 and s.e2e_ms.max == 600.0
    assert s.queue_ms.mean == approx(10.0)
    # TPOT = (E2E - TTFT) / (out - 1): a = 300/5, b = 400/1
    assert s.tpot_ms.count == 2 and (s.tpot_ms.min, s.tpot_ms.max) == approx((60.0, 400.0))
    # lengths from usage
    assert (s.input_len.min, s.input_len.max) == (100.0, 200.0)
    assert s.output_len.mean == approx(4.0)
    assert s.cached_len.max == 50.0


def test_itl_is_weighted_per_token_not_per_chunk():
    s = summarize(_records(), load=None, window=(1.0, 2.5), sla=None, gpu=None, server=None, lengths_exact=False)
    # a: gap 100 over 2 tokens -> 50, 50; gap 200 over 3 tokens -> 66.67 x3; b: one gap of 400
    assert s.itl_ms.count == 6
    assert s.itl_ms.mean == approx(700 / 6)  # per-chunk counting would give (100+200+400)/3
    assert s.itl_ms.p50 == approx(200 / 3)
    assert s.itl_ms.p90 == approx(200 / 3 + 0.5 * (400 - 200 / 3))
    assert s.itl_ms.min == 50.0


def test_throughput_counts_what_falls_in_the_window():
    s = summarize(_records(), load=None, window=(1.0, 2.0), sla=None, gpu=None, server=None, lengths_exact=False)
    assert (s.window_start_s, s.window_end_s, s.window_s, s.window_source) == (1.0, 2.0, 1.0, "stated")
    assert s.request_throughput == approx(1.0)  # a ends at 1.4; b ends at 2.1 (outside)
    # one set for every rate: the requests that completed in the window (a alone)
    assert s.output_tokens_per_s == approx(6.0)  # a: 1+2+3
    assert s.decode_tokens_per_s == approx(5.0)  # its first token belongs to prefill
    assert s.input_tokens_per_s == approx(100.0)
    assert s.total_tokens_per_s == approx(106.0)
    # what arrived in the window: a's 6 tokens and b's first chunk (at 1.7)
    assert s.output_tokens_per_s_arrived == approx(7.0) and s.throughput_mismatch == approx(7 / 6 - 1)

    half = summarize(_records(), load=None, window=(1.0, 1.5), sla=None, gpu=None, server=None, lengths_exact=False)
    assert half.output_tokens_per_s == approx(6 / 0.5)
    assert half.input_tokens_per_s == approx(100 / 0.5)


def test_latencies_come_from_the_requests_that_completed_in_the_window():
    s = summarize(_records(), load=None, window=(1.0, 2.0), sla=None, gpu=None, server=None, lengths_exact=False)
    # b ends at 2.1 and the failed request at 2.3: only a is in the window's set
    assert s.completions_in_window == 1 and s.ttft_ms.count == 1 and s.ttft_ms.p50 == approx(100.0)
    assert s.request_throughput == approx(1.0) and s.tokens_per_request == approx(6.0)


def test_no_steady_window_spans_send_to_end_and_is_invalid():
    # four streams, but the last dispatch (2.0) comes before the fourth completion (2.3)
    for window in (None, (2.0, 2.0), (3.0, 1.0)):
        s = summarize(_records(), load={"mode": "concurrency", "concurrency": 4}, window=window, sla=None, gpu=None,
                      server=None, lengths_exact=False)
        # first measured send 1.0; last measured end: the failed request at 2.0 + 0.3
        assert (s.window_start_s, s.window_end_s, s.window_source) == (1.0, approx(2.3), "no_steady_window")
        assert s.valid is False and s.invalid_reasons[0].startswith("no steady window")
        assert s.request_throughput == approx(2 / 1.3)
        assert s.output_tokens_per_s == approx(8 / 1.3)


def test_chunks_without_counts_carry_one_token():
    r = RequestRecord(
        request_id=1, t_send_s=0.0, ttft_ms=10.0, e2e_ms=30.0, chunk_offsets_ms=[10.0, 20.0, 30.0]
    )
    s = summarize([r], load=None, window=(0.0, 1.0), sla=None, gpu=None, server=None, lengths_exact=False)
    assert s.output_tokens_per_s == approx(3.0)
    assert s.decode_tokens_per_s == approx(2.0)
    assert s.input_tokens_per_s is None and s.total_tokens_per_s is None  # no usage: unknown, not 0
    assert s.itl_ms.count == 2 and s.itl_ms.mean == approx(10.0)


def test_goodput_counts_requests_meeting_every_bound():
    recs = _records()
    s = summarize(recs, load=None, window=(1.0, 2.5), sla=SLA(ttft_ms=150), gpu=None, server=None, lengths_exact=False)
    assert s.sla == {"ttft_ms": 150.0}
    assert s.goodput_fraction == approx(1 / 3)  # only a; the failed request counts in the denominator
    assert s.goodput_rps == approx(1 / 1.5)
    assert s.goodput_rps <= s.request_throughput

    both = summarize(
        recs,
        load=None,
        window=(1.0, 2.5),
        sla=SLA(ttft_ms=1000, tpot_ms=100),
        gpu=None,
        server=None,
        lengths_exact=False,
    )
    assert both.goodput_fraction == approx(1 / 3)  # b's TPOT is 400 ms
    assert both.goodput_rps == approx(1 / 1.5)

    loose = summarize(recs, load=None, window=(1.0, 2.5), sla=SLA(p99_e2e_ms=10_000), gpu=None, server=None,
                      lengths_exact=False)
    assert loose.sla == {"e2e_ms": 10_000.0}  # the p99 bound stands in for the per-request one
    assert loose.goodput_fraction == approx(2 / 3)
    assert loose.goodput_rps == approx(2 / 1.5)

    none = summarize(recs, load=None, window=(1.0, 2.0), sla=None, gpu=None, server=None, lengths_exact=False)
    assert none.goodput_rps is None and none.goodput_fraction is None and none.sla == {}


def test_prefix_hit_rate_is_none_when_unknown_and_zero_when_zero():
    recs = _records()
    assert prefix_hit_rate([r for r in recs if not r.warmup]) == approx(50 / 300)
    s = summarize(recs, load=None, window=(1.0, 2.0), sla=None, gpu=None, server=None, lengths_exact=False)
    assert s.prefix_hit_rate == approx(50 / 300)  # the warm-up request's 100% hit is not counted

    unknown = [RequestRecord(request_id=i, ttft_ms=1, e2e_ms=2, prompt_tokens=10) for i in range(3)]
    assert (
        summarize(unknown, load=None, window=(0, 1), sla=None, gpu=None, server=None, lengths_exact=False
        ).prefix_hit_rate
        is None
    )
    zero = [
        RequestRecord(request_id=i, ttft_ms=1, e2e_ms=2, prompt_tokens=10, cached_tokens=0) for i in range(3)
    ]
    assert (
        summarize(zero, load=None, window=(0, 1), sla=None, gpu=None, server=None, lengths_exact=False).prefix_hit_rate
        == 0.0
    )


def _gpu_dict() -> dict:
    def sample(t, g, used, util, power):
        return {"t_s": t, "gpu": g, "mem_used": used, "mem_total": 100, "util": util, "power_w": power}

    return {
        "state": "ok",
        "interval_ms": 100.0,
        "processes_at_start": [],
        "samples": [
            sample(0.0, 0, 10, 0, 50.0),
            sample(0.0, 1, 20, 10, 60.0),
            sample(0.1, 0, 40, 50, 100.0),
            sample(0.1, 1, 50, 70, 120.0),
            sample(0.2, 0, 30, 20, 80.0),
            sample(0.2, 1, 30, 30, 90.0),
        ],
    }


def test_gpu_memory_curve_sums_gpus_per_sweep():
    s = summarize([], load=None, window=None, sla=None, gpu=_gpu_dict(), server=None, lengths_exact=False)
    assert s.gpu_state == "ok" and s.gpu_samples == 3 and s.gpu_sample_interval_ms == 100.0
    assert s.gpu_mem_idle_bytes == 30  # sum at the first sweep
    assert s.gpu_mem_peak_bytes == 90
    assert s.gpu_mem_mean_bytes == approx(60.0)
    assert s.gpu_mem_total_bytes == 200
    assert s.gpu_mem_peak_fraction == approx(0.45)
    assert s.gpu_util_mean == approx(30.0)
    assert s.gpu_power_mean_w == approx((110 + 220 + 170) / 3)  # board power summed over GPUs
    assert s.gpu_clean_at_start is True


def test_gpu_sweeps_split_on_repeated_index_even_with_distinct_timestamps():
    samples = [{"t_s": 0.01 * i, "gpu": i % 2} for i in range(5)]
    assert [sorted(sw) for sw in gpu_sweeps(samples)] == [[0, 1], [0, 1], [0]]


def test_gpu_clean_at_start_needs_the_samplers_verdict():
    def with_procs(procs):
        gpu = _gpu_dict() | {"processes_at_start": procs}
        return summarize([], load=None, window=None, sla=None, gpu=gpu, server=None, lengths_exact=False
        ).gpu_clean_at_start

    assert with_procs([]) is True
    assert with_procs([{"pid": 1, "foreign": False}]) is True  # the server under test
    assert with_procs([{"pid": 1, "foreign": False}, {"pid": 4242, "foreign": True}]) is False
    assert with_procs([{"pid": 4242, "name": "python"}]) is None  # server PIDs unknown: cannot tell


def test_no_gpu_is_passed_through():
    s = summarize(
        [],
        load=None,
        sla=None,
        gpu={"state": "no_gpu", "samples": [], "processes_at_start": []},
        server=None,
        lengths_exact=False,
    )
    assert s.gpu_state == "no_gpu" and s.gpu_samples == 0 and s.gpu_clean_at_start is None
    assert s.gpu_mem_peak_bytes is None and s.gpu_mem_peak_fraction is None


def test_all_failed():
    recs = [
        RequestRecord(request_id=i, t_send_s=0.1 * i, e2e_ms=5.0, error_class="connection") for i in range(4)
    ]
    s = summarize(recs, load=None, window=(0.0, 1.0), sla=SLA(ttft_ms=100), gpu=None, server=None, lengths_exact=False)
    assert (s.requests_measured, s.requests_ok, s.requests_failed, s.error_rate) == (4, 0, 4, 1.0)
    assert s.errors_by_class == {"connection": 4}
    assert s.ttft_ms.count == 0 and s.ttft_ms.p99 is None and s.itl_ms.count == 0
    assert s.request_throughput == 0.0 and s.output_tokens_per_s == 0.0
    assert s.input_tokens_per_s is None
    assert s.goodput_fraction == 0.0 and s.goodput_rps == 0.0
    assert s.prefix_hit_rate is None


def test_no_records():
    s = summarize([], load=None, window=None, sla=SLA(ttft_ms=100), gpu=None, server=None, lengths_exact=False)
    assert (s.requests_total, s.requests_measured, s.error_rate) == (0, 0, 0.0)
    assert s.window_s is None and s.request_throughput is None
    assert s.goodput_fraction is None and s.goodput_rps is None
    assert s.gpu_state == "unknown"


def test_summary_survives_the_result_json_round_trip(tmp_path):
    s = summarize(_records(), load=None, window=(1.0, 2.0), sla=SLA(ttft_ms=150), gpu=_gpu_dict(), server=None,
                  lengths_exact=True)
    path = TrialResult(records=_records(), summary=s, load={"concurrency": 2}).save(tmp_path / "r.json")
    back = TrialResult.read(path)
    assert back.summary == s


def test_a_burst_with_no_steady_state_is_invalid():
    # all requests sent at once (requests <= concurrency): nothing but the start-up burst
    recs = [
        RequestRecord(
            request_id=i, t_send_s=1.0, ttft_ms=50.0, e2e_ms=500.0, chunk_offsets_ms=[50.0], chunk_tokens=[1]
        )
        for i in range(4)
    ]
    s = summarize(recs, load={"mode": "concurrency", "concurrency": 4}, sla=None, gpu=None, server=None,
                  lengths_exact=False)
    assert (s.window_start_s, s.window_end_s, s.window_source) == (1.0, 1.5, "no_steady_window")
    assert s.request_throughput == approx(8.0) and s.valid is False


def test_flat_chunk_arrays_agree_with_the_per_record_definition():
    import random

    from servetune.metrics import Chunks

    rng = random.Random(5)
    recs = []
    for i in range(200):
        n = rng.randint(0, 12)
        offs = sorted(rng.uniform(1, 500) for _ in range(n))
        toks = [rng.randint(0, 4) for _ in range(rng.choice([n, max(n - 2, 0)]))]  # zeros, missing counts
        recs.append(
            RequestRecord(request_id=i, t_send_s=rng.uniform(0, 5), chunk_offsets_ms=offs, chunk_tokens=toks)
        )
    pooled = [g for r in recs for g in r.itl_gaps_ms()]
    assert Chunks.of(recs).itl_gaps_ms().tolist() == approx(pooled)

    out = dec = 0
    for r in recs:
        for j, off in enumerate(r.chunk_offsets_ms):
            if 1.0 <= r.t_send_s + off / 1000 <= 4.0:
                k = max(r.chunk_tokens[j], 0) if j < len(r.chunk_tokens) else 1
                out += k
                dec += k - 1 if j == 0 else k
    assert Chunks.of(recs).in_window(1.0, 4.0) == (out, max(dec, 0))
