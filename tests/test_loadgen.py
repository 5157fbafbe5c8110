"""run_load against a real aiohttp SSE server that logs its own send times (tests/sse_server.py)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Iterator

import numpy as np
import orjson
import pytest

from servetune.loadgen import LoadConfig, Target, TargetUnreachable, run_load, run_load_sync
from servetune.records import ErrorClass, RequestRecord, TokenCountSource
from servetune.workload.request import WorkloadRequest
from sse_server import Scenario, ServerProcess, SseServer, realtime


def _requests(n: int, out: int = 16, tag: str = "") -> list[WorkloadRequest]:
    return [
        WorkloadRequest(index=i, system=None, user=f"hello world #{i} {tag}", input_tokens=4, output_tokens=out)
        for i in range(n)
    ]


@contextlib.contextmanager
def _realtime_client() -> Iterator[None]:
    """Timing tests judge the client, not the other tenants of a shared 2-core machine: the client
    thread (and the server process) run SCHED_FIFO for the few seconds of the run when permitted."""
    ok = realtime(5)
    try:
        yield
    finally:
        if ok:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


def _recv_minus_send_ms(rec: RequestRecord, chunk_ns: list[int], t0_ns: int) -> np.ndarray:
    """Client arrival time minus server send time, per content chunk (same clock, same machine)."""
    t_send_ns = t0_ns + rec.t_send_s * 1e9
    recv = t_send_ns + np.asarray(rec.chunk_offsets_ms) * 1e6
    return (recv - np.asarray(chunk_ns)) / 1e6


async def test_timings_match_the_server_send_log_at_concurrency_64(tmp_path) -> None:
    """The server runs in its own process, as a real engine would, and logs every send."""
    with ServerProcess(Scenario(ttft_ms=20, gap_ms=10), tmp_path, rt_priority=5) as srv, _realtime_client():
        t0 = time.perf_counter_ns()
        out = await run_load(
            Target(url=srv.url), _requests(192, out=24), LoadConfig(concurrency=64, warmup_requests=64), t0_ns=t0
        )
    log = srv.log()
    measured = [r for r in out.records if not r.warmup]
    assert len(measured) == 128 and all(r.ok for r in measured)
    ttft_err, chunk_err, gap_err = [], [], []
    for rec in measured:
        sent = log[rec.request_id]["chunk_ns"]
        assert len(rec.chunk_offsets_ms) == len(sent) == 24
        true_ttft = (sent[0] - (t0 + rec.t_send_s * 1e9)) / 1e6
        ttft_err.append(rec.ttft_ms - true_ttft)
        chunk_err.extend(_recv_minus_send_ms(rec, sent, t0))
        gap_err.extend(np.diff(rec.chunk_offsets_ms) - np.diff(sent) / 1e6)
        assert rec.token_count_source == TokenCountSource.APPORTIONED
        assert rec.completion_tokens == 24 and rec.prompt_tokens == 3 and rec.cached_tokens == 3
    chunk_err, gap_err, ttft_err = map(np.asarray, (chunk_err, gap_err, ttft_err))
    assert chunk_err.min() >= 0  # a chunk cannot arrive before it was sent
    # alone these are all < 1 ms at p90; inside the full suite on 2 cores the TTFT error's p90 was 2.7-5.6 ms
    # and its p50 0.09-0.51 ms over four CI runs (other tests' processes share the cores): the median is held to
    # the 1 ms the load generator promises for TTFT p50, the tail to 10 ms (the client's lag is a validity rule)
    for err in (ttft_err, chunk_err, np.abs(gap_err)):
        assert np.percentile(err, 50) < 1.0 and np.percentile(err, 90) < 10.0, np.percentile(err, [50, 90, 99, 100])
    assert 0 < out.window_start_s < out.window_end_s < out.drain_end_s


async def test_a_server_of_two_processes_is_one_load(tmp_path) -> None:
    """bench/client_overhead.py feeds 1,024 streams from several server processes on one port: the kernel
    spreads the connections, the merged send log holds every request and the shared counter every chunk."""
    with ServerProcess(Scenario(ttft_ms=5, gap_ms=5), tmp_path, processes=2) as srv:
        out = await run_load(Target(url=srv.url), _requests(96, out=8), LoadConfig(concurrency=32),
                             t0_ns=time.perf_counter_ns())
        counted = srv.chunks_sent()
    log = srv.log()
    assert all(r.ok for r in out.records) and len(out.records) == 96
    assert {r.request_id for r in out.records} <= set(log)
    assert counted == sum(len(v["chunk_ns"]) for v in log.values()) == 96 * 8
    per_process = [orjson.loads((tmp_path / f"sendlog-{i}.json").read_bytes()) for i in range(2)]
    assert all(per_process) and sum(map(len, per_process)) == len(log)  # both served, no request twice


@pytest.mark.parametrize("shape,source", [("usage_chunk", "apportioned"), ("usage_every", "usage_per_chunk")])
async def test_multi_token_chunks_weight_itl_per_token(tmp_path, shape: str, source: str) -> None:
    """A chunk of k tokens gives k gaps of gap/k (docs/metrics.md), whichever source counted the tokens."""
    scenario = Scenario(ttft_ms=5, gap_ms=12, tokens_per_chunk=3, shape=shape)
    with ServerProcess(scenario, tmp_path, rt_priority=5) as srv, _realtime_client():
        t0 = time.perf_counter_ns()
        out = await run_load(Target(url=srv.url), _requests(4, out=30), LoadConfig(concurrency=4), t0_ns=t0)
    log = srv.log()
    pooled = []
    for rec in out.records:
        sent = log[rec.request_id]
        assert rec.token_count_source == source
        assert rec.chunk_tokens == sent["chunk_tokens"] == [3] * 10
        gaps = np.asarray(rec.itl_gaps_ms())
        assert len(gaps) == 27  # 9 later chunks x 3 tokens
        true = np.repeat(np.diff(sent["chunk_ns"]) / 1e6 / 3, 3)
        err = np.abs(gaps - true)  # a 1 ms chunk-gap error is 1/3 ms per token
        # a weighting error would put the median at 4 ms (the whole 12 ms chunk gap on one token, none on the
        # other two: errors 8, 4, 4 ms); alone the median is < 0.05 ms
        assert np.median(err) < 0.34, np.percentile(err, [50, 90, 100])
        assert np.median(gaps) == pytest.approx(4.0, abs=1.0)
        pooled.append(err)
    # the tail over all four streams: one chunk 3 ms late (a full suite run on 2 shared cores) moves 6 of a
    # stream's 27 per-token gaps, so a per-stream p90 failed there (1.05 ms) on a tail, not on weighting
    pooled = np.concatenate(pooled)
    assert np.percentile(pooled, 75) < 1.0, np.percentile(pooled, [50, 75, 90, 100])


class _WordCounter:
    def count(self, text: str) -> int:
        return len(text.split())


@pytest.mark.parametrize(
    "endpoint,shape,source",
    [
        ("chat", "usage_chunk", TokenCountSource.APPORTIONED),  # (a) separate usage chunk + [DONE]
        ("chat", "usage_in_last", TokenCountSource.APPORTIONED),  # (b) usage in last content chunk, no [DONE]
        ("completions", "usage_chunk", TokenCountSource.APPORTIONED),
        ("completions", "usage_in_last", TokenCountSource.APPORTIONED),
        ("chat", "usage_every", TokenCountSource.USAGE_PER_CHUNK),
        ("chat", "no_usage", TokenCountSource.CHUNKS),
        ("generate", "usage_chunk", TokenCountSource.META_INFO),  # cumulative text + meta_info
    ],
)
@pytest.mark.parametrize("client", ["raw", "aiohttp"])
async def test_stream_shapes(endpoint: str, shape: str, source: TokenCountSource, client: str) -> None:
    async with SseServer(Scenario(ttft_ms=25, gap_ms=2, tokens_per_chunk=2, shape=shape)) as srv:
        t0 = time.perf_counter_ns()
        out = await run_load(
            Target(url=srv.url, endpoint=endpoint, http_client=client), _requests(3, out=9), LoadConfig(concurrency=3),
            t0_ns=t0,
        )
    assert out.http_client == client
    for rec in out.records:
        log = srv.log[rec.request_id]
        assert rec.ok, rec.error_message
        assert rec.token_count_source == source.value
        assert len(rec.chunk_offsets_ms) == 5
        if source is TokenCountSource.CHUNKS:  # no usage at all: one per chunk, flagged
            assert rec.chunk_tokens == [1] * 5 and rec.completion_tokens is None
        else:
            assert rec.completion_tokens == 9 and rec.prompt_tokens == log.prompt_tokens == 3
            assert rec.cached_tokens == 3 and rec.chunk_tokens == [2, 2, 2, 2, 1]
        # the role-only chunk (sent at once) is not the first token: TTFT is the first content send
        true_ttft = (log.chunk_ns[0] - (t0 + rec.t_send_s * 1e9)) / 1e6
        assert true_ttft >= 25 and rec.ttft_ms >= true_ttft  # (accuracy: the ServerProcess tests)


async def test_tokenizer_counts_chunks_when_the_server_gives_no_per_chunk_counts() -> None:
    async with SseServer(Scenario(ttft_ms=1, gap_ms=1, tokens_per_chunk=2)) as srv:
        out = await run_load(
            Target(url=srv.url),
            _requests(2, out=7),
            LoadConfig(concurrency=2),
            t0_ns=time.perf_counter_ns(),
            tokenizer=_WordCounter(),
        )
    for rec in out.records:
        assert rec.token_count_source == "tokenizer"
        assert rec.chunk_tokens == [2, 2, 2, 1] and rec.client_completion_tokens == 7 == rec.completion_tokens


@pytest.mark.parametrize("client", ["raw", "aiohttp"])
async def test_every_error_class_is_recorded_and_the_run_completes(client: str) -> None:
    fails = {
        "400": ErrorClass.HTTP_4XX,
        "500": ErrorClass.HTTP_5XX,
        "503": ErrorClass.REJECTED_503,
        "stall": ErrorClass.TIMEOUT,
        "reset": ErrorClass.CONNECTION,
        "malformed": ErrorClass.MALFORMED,
        "error_event": ErrorClass.MALFORMED,
        "empty": ErrorClass.EMPTY,
        None: None,
    }
    reqs = [
        WorkloadRequest(index=i, system=None, user=f"#{i} [fail:{f}]" if f else f"#{i}", input_tokens=2,
                        output_tokens=6)
        for i, f in enumerate(fails)
    ]
    seen: list[tuple[int, int, int]] = []
    async with SseServer(Scenario(ttft_ms=5, gap_ms=5, fail_after_chunks=2)) as srv:
        out = await run_load(
            Target(url=srv.url, timeout_s=1.0, http_client=client),
            reqs,
            LoadConfig(concurrency=len(reqs)),
            t0_ns=time.perf_counter_ns(),
            progress=lambda *c: seen.append(c),
        )
    got = {f: rec.error_class for f, rec in zip(fails, out.records, strict=True)}
    assert got == {f: (c.value if c else None) for f, c in fails.items()}
    by = dict(zip(fails, out.records, strict=True))
    assert by["503"].http_status == 503 and "scheduled 503" in by["503"].error_message
    for partial in ("reset", "malformed", "error_event"):  # partial timings are kept
        assert len(by[partial].chunk_offsets_ms) == 2 and by[partial].ttft_ms is not None
    assert "scheduled error event" in by["error_event"].error_message
    assert by["stall"].e2e_ms == pytest.approx(1000, abs=300)
    assert seen[-1] == (9, 8, 6 + 2 + 2 + 2)  # done, errors, output tokens (partial chunks count)


async def test_unreachable_target_fails_before_sending() -> None:
    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(TargetUnreachable, match=f"{url}.*unreachable"):
        await run_load(Target(url=url), _requests(2), LoadConfig(concurrency=2), t0_ns=time.perf_counter_ns())


async def test_more_warmup_than_requests_is_refused() -> None:
    with pytest.raises(ValueError, match="warmup_requests"):
        await run_load(
            Target(url="http://127.0.0.1:1"),
            _requests(2),
            LoadConfig(concurrency=2, warmup_requests=2),
            t0_ns=time.perf_counter_ns(),
        )


async def test_api_key_is_sent_as_bearer_and_never_recorded(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "sk-test-DO-NOT-LEAK-4242"
    monkeypatch.setenv("MY_KEY", secret)
    caplog.set_level(logging.DEBUG)
    target = Target(url="http://127.0.0.1:1", api_key_env="MY_KEY")
    async with SseServer(Scenario(ttft_ms=1, gap_ms=1)) as srv:
        target = target.model_copy(update={"url": srv.url})
        out = await run_load(
            target, _requests(3, out=2, tag="[fail:400]"), LoadConfig(concurrency=2), t0_ns=time.perf_counter_ns()
        )
    assert {lg.authorization for lg in srv.log.values()} == {f"Bearer {secret}"}
    dumped = orjson.dumps([r.to_dict() for r in out.records]).decode()
    for text in (repr(target), target.model_dump_json(), str(target.model_dump()), dumped, caplog.text):
        assert secret not in text
    assert all(r.error_class == "http_4xx" for r in out.records)  # the run still recorded every request

    # OPENAI_API_KEY is the fallback when the named variable is unset
    monkeypatch.delenv("MY_KEY")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fallback")
    assert target.api_key() == "sk-fallback"


async def test_warmup_comes_first_in_the_same_load_and_is_flagged() -> None:
    """No pause between warm-up and measured requests: the streams stay busy (servetune.validity)."""
    async with SseServer(Scenario(ttft_ms=2, gap_ms=2)) as srv:
        out = await run_load(
            Target(url=srv.url), _requests(12, out=4), LoadConfig(concurrency=3, warmup_requests=5),
            t0_ns=time.perf_counter_ns(),
        )
    assert [r.warmup for r in out.records] == [True] * 5 + [False] * 7
    assert [r.request_id for r in out.records] == list(range(12))
    first_measured = min(r.t_send_s for r in out.records[5:])
    assert max(r.t_send_s for r in out.records[:5]) <= first_measured == out.window_start_s
    warm_end = max(r.t_send_s + r.e2e_ms / 1e3 for r in out.records[:5])
    assert first_measured < warm_end  # a stream moved on to a measured request while warm-up was in flight
    assert out.window_end_s == max(r.t_send_s for r in out.records[5:])
    assert out.drain_end_s >= max(r.t_send_s + r.e2e_ms / 1e3 for r in out.records)


async def test_constant_rate_dispatch_follows_the_schedule() -> None:
    async with SseServer(Scenario(ttft_ms=2, gap_ms=2)) as srv:
        with _realtime_client():
            out = await run_load(
                Target(url=srv.url),
                _requests(41, out=3),
                LoadConfig(mode="rate", rate=40, arrival="constant", concurrency=64, warmup_requests=1),
                t0_ns=time.perf_counter_ns(),
            )
    measured = out.records[1:]
    first_due = out.records[0].t_send_s - out.records[0].queue_ms / 1e3  # the schedule's origin (warm-up first)
    dispatch = np.array([r.t_send_s - first_due for r in measured])
    error_ms = (dispatch - np.arange(1, 41) / 40) * 1e3
    assert np.all(error_ms > -0.5)  # never early
    # a loaded 2-core host delays a wake-up now and then (6.1 ms once in a full suite run): the bulk holds to
    # milliseconds, and no request slips by most of a slot (25 ms apart), which a schedule bug would
    assert np.median(error_ms) < 2.0 and np.percentile(error_ms, 90) < 5.0 and np.max(error_ms) < 15.0, error_ms
    assert all(r.ok for r in measured)


async def test_poisson_rate_is_seeded_and_its_mean_rate_holds() -> None:
    load = LoadConfig(mode="rate", rate=200, arrival="poisson", concurrency=64, seed=3)
    async with SseServer(Scenario(ttft_ms=1, gap_ms=1)) as srv:
        with _realtime_client():
            out = await run_load(Target(url=srv.url), _requests(401, out=2), load, t0_ns=time.perf_counter_ns())
    sends = np.array([r.t_send_s for r in out.records])
    rate = 400 / (sends[-1] - sends[0])
    assert rate == pytest.approx(200, rel=0.15)
    from servetune.loadgen.strategies import arrival_offsets_s

    planned = np.asarray(arrival_offsets_s(load, 401))
    origin = out.records[0].t_send_s - out.records[0].queue_ms / 1e3
    assert np.median(np.abs(sends - origin - planned)) * 1e3 < 3.0


async def test_rate_mode_caps_in_flight_and_records_queueing() -> None:
    async with SseServer(Scenario(ttft_ms=20, gap_ms=10)) as srv:
        out = await run_load(
            Target(url=srv.url),
            _requests(12, out=3),
            LoadConfig(mode="rate", rate=1000, arrival="constant", concurrency=3),
            t0_ns=time.perf_counter_ns(),
        )
    spans = [(r.t_send_s, r.t_send_s + r.e2e_ms / 1e3) for r in out.records]
    in_flight = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
    assert in_flight == 3
    assert out.records[-1].queue_ms > 100  # waited for a slot far behind its 11 ms due time


def test_run_load_sync_runs_on_its_own_loop() -> None:
    import asyncio
    import threading

    result: dict = {}

    def serve_and_load() -> None:
        async def main() -> None:
            async with SseServer(Scenario(ttft_ms=1, gap_ms=1)) as srv:
                result["url"] = srv.url
                ready.set()
                await asyncio.to_thread(done.wait, 30)

        asyncio.run(main())

    ready, done = threading.Event(), threading.Event()
    th = threading.Thread(target=serve_and_load)
    th.start()
    try:
        assert ready.wait(10)
        out = run_load_sync(Target(url=result["url"]), _requests(3, out=2), LoadConfig(concurrency=2))
        assert len(out.records) == 3 and all(r.ok for r in out.records)
    finally:
        done.set()
        th.join(30)
