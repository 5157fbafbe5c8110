"""run_trial against a real streaming HTTP server (tests/sse_server.py) with a request log of its own.

The SSE server runs on the test's event loop; run_trial (synchronous, its own loop) runs in a
worker thread, as the CLI and the Airflow tasks call it.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from pydantic import ValidationError

from servetune.loadgen import LoadConfig, Target, TargetUnreachable
from servetune.result import TrialResult
from servetune.sla import SLA
from servetune.trial import TrialRequest, run_trial
from servetune.workload.spec import Fixed, WorkloadSpec
from sse_server import Scenario, SseServer

SECRET = "sk-trial-test-0123456789"
GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions", "/generate")


@dataclass
class Observed:
    """Every HTTP request the server saw, in arrival order: (path, method, perf_counter_ns, Authorization)."""

    calls: list[tuple[str, str, int, str | None]] = field(default_factory=list)

    def times(self, path: str) -> list[int]:
        return [t for p, _, t, _ in self.calls if p == path]

    def auth(self, path: str) -> set[str | None]:
        return {a for p, _, _, a in self.calls if p == path}

    @property
    def generations(self) -> list[int]:
        return [t for p, _, t, _ in self.calls if p in GENERATION_PATHS]


def _metrics_text(srv: SseServer) -> str:
    """An SGLang-style exposition whose counters follow what the server really served."""
    prompt = sum(lg.prompt_tokens for lg in srv.log.values())
    cached = srv.scenario.cached_tokens * len(srv.log)
    gen = sum(lg.completion_tokens for lg in srv.log.values())
    return (
        "# HELP sglang:prompt_tokens_total Number of prefill tokens processed.\n"
        "# TYPE sglang:prompt_tokens_total counter\n"
        f'sglang:prompt_tokens_total{{model_name="sse-test"}} {prompt}.0\n'
        "# HELP sglang:cached_tokens_total Number of cached prompt tokens.\n"
        "# TYPE sglang:cached_tokens_total counter\n"
        f'sglang:cached_tokens_total{{model_name="sse-test"}} {cached}.0\n'
        "# HELP sglang:generation_tokens_total Number of generation tokens processed.\n"
        "# TYPE sglang:generation_tokens_total counter\n"
        f'sglang:generation_tokens_total{{model_name="sse-test"}} {gen}.0\n'
        "# HELP sglang:num_running_reqs The number of running requests.\n"
        "# TYPE sglang:num_running_reqs gauge\n"
        f'sglang:num_running_reqs{{model_name="sse-test"}} 0.0\n'
    )


async def _serve(
    scenario: Scenario, *, flush: bool = True, metrics: bool = True
) -> tuple[SseServer, Observed]:
    srv = SseServer(scenario)
    seen = Observed()

    @web.middleware
    async def record(request: web.Request, handler):  # noqa: ANN001, ANN202
        seen.calls.append(
            (request.path, request.method, time.perf_counter_ns(), request.headers.get("Authorization"))
        )
        return await handler(request)

    srv.app.middlewares.append(record)
    if flush:

        async def flush_cache(request: web.Request) -> web.Response:
            return web.Response(text="Cache flushed.")

        srv.app.router.add_post("/flush_cache", flush_cache)
    if metrics:

        async def metrics_route(request: web.Request) -> web.Response:
            return web.Response(text=_metrics_text(srv), content_type="text/plain")

        srv.app.router.add_get("/metrics", metrics_route)
    await srv.start()
    return srv, seen


@pytest.fixture
async def server() -> AsyncIterator[tuple[SseServer, Observed]]:
    srv, seen = await _serve(Scenario(ttft_ms=20, gap_ms=4, tokens_per_chunk=2, shape="usage_chunk"))
    yield srv, seen
    await srv.stop()


def _request(url: str, **kw) -> TrialRequest:  # noqa: ANN003
    base = dict(
        target=Target(url=url, endpoint="chat", model="sse-test"),
        load=LoadConfig(concurrency=3, warmup_requests=2),
        workload=WorkloadSpec(name="tiny", input=Fixed(value=32), output=Fixed(value=8)),
        num_requests=12,
        scrape_interval_s=0.05,
        gpu_interval_ms=20,
    )
    return TrialRequest(**(base | kw))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_trial_measures_every_request_and_states_its_inputs(server, tmp_path, monkeypatch):
    srv, seen = server
    monkeypatch.setenv("SERVETUNE_API_KEY", SECRET)
    req = _request(
        srv.url, sla=SLA(ttft_ms=10_000, tpot_ms=10_000), server_config={"chunked-prefill-size": 4096}
    )
    result = await asyncio.to_thread(run_trial, req)

    assert result.status == "ok", result.failure_reason
    assert len(result.records) == 14 and sum(r.warmup for r in result.records) == 2
    assert len(seen.generations) == 14
    s = result.summary
    assert (s.requests_measured, s.requests_ok, s.error_rate) == (12, 12, 0.0)
    # causality: the server waits 20 ms before the first chunk and 4 ms between its 4 chunks
    assert s.ttft_ms.min >= 20.0
    assert all(r.ttft_ms < r.e2e_ms for r in result.records)
    assert s.e2e_ms.min >= 20.0 + 3 * 4.0
    # the figures come from the requests that completed in the steady window (one turnover of the
    # three streams .. the last dispatch): a tiny trial like this one is INVALID, and says why
    n = s.completions_in_window
    assert 0 < n < 12 and s.valid is False and any("completed in the window" in r for r in s.invalid_reasons)
    # 8 tokens in chunks of 2: three chunk gaps, each split over 2 tokens -> 6 per-token gaps
    assert s.itl_ms.count == n * 6
    assert s.output_len.min == s.output_len.max == 8
    assert s.tpot_ms.count == n
    # the chunk gaps are the server's own: each stream's first-to-last span as the client stamped it (kernel
    # arrival stamps) lies between what the server's own stamps allow. Its first chunk arrived after that
    # write began and before it returned, its last after the last write began and before the stream's end
    # was written. A busy host delays a write after its stamp, but the delay lies inside these bounds, so
    # they hold at any load. A chunk read together with the next shares that one's stamp and shortens its
    # stream's span: such streams (a repeated stamp) are counted and excused from the lower bound.
    # The server cannot tell which stream is which request here, so the spans are compared sorted: when each
    # stream is within its own bounds, the k-th shortest span is within the k-th smallest bounds.
    assert result.load["arrival_stamps"] == ("kernel" if sys.platform == "linux" else "client")
    spans = sorted(r.chunk_offsets_ms[-1] - r.chunk_offsets_ms[0] for r in result.records)
    merged = sum(len(set(r.chunk_offsets_ms)) < len(r.chunk_offsets_ms) for r in result.records)
    logs = list(srv.log.values())
    upper = sorted((lg.end_ns - lg.chunk_ns[0]) / 1e6 + 0.1 for lg in logs)
    lower = sorted((lg.chunk_ns[-1] - lg.chunk_end_ns[0]) / 1e6 - 0.1 for lg in logs)
    assert len(spans) == len(logs) == 14
    assert all(got <= most for got, most in zip(spans, upper, strict=True)), (spans, upper)
    if sys.platform == "linux":
        assert all(spans[k] >= lower[k - merged] for k in range(merged, 14)), (spans, lower, merged)
    assert s.token_count_sources == {"apportioned": 12}
    assert s.output_tokens_per_s > 0 and s.decode_tokens_per_s < s.output_tokens_per_s
    assert s.window_s > 0 and s.window_source == "steady" and s.in_flight_mean == pytest.approx(3, rel=0.1)
    assert s.goodput_fraction == 1.0 and s.sla == {"ttft_ms": 10_000.0, "tpot_ms": 10_000.0}
    # the SSE server reports 3 cached tokens per request
    assert s.prefix_hit_rate == pytest.approx(
        3 * 12 / sum(r.prompt_tokens for r in result.records if not r.warmup)
    )
    # no GPU on this machine: stated, not invented
    assert s.gpu_state == "no_gpu" and s.gpu_mem_peak_bytes is None

    # the prefix cache is flushed once, before the warm-up request
    (flush_t,) = seen.times("/flush_cache")
    assert flush_t < min(seen.generations)
    assert result.server["flush_cache"]["flushed"] is True

    # inputs travel with the result; the JSON round-trips
    assert result.workload["fingerprint"] and result.workload["spec"]["input"] == {
        "kind": "fixed",
        "value": 32,
    }
    assert result.load["concurrency"] == 3 and result.load["requests"] == 12
    assert result.server_config == {"chunked-prefill-size": 4096}
    assert result.target["url"] == srv.url and result.environment
    path = result.save(tmp_path / "t.json")
    back = TrialResult.read(path)
    assert back.summary == result.summary and len(back.records) == 14
    # the API key was sent, and is nowhere in the result
    assert all(lg.authorization == f"Bearer {SECRET}" for lg in srv.log.values())
    assert seen.auth("/flush_cache") == seen.auth("/metrics") == {f"Bearer {SECRET}"}
    assert SECRET.encode() not in path.read_bytes()


async def test_server_side_hit_rate_comes_from_metrics_counter_deltas(server):
    srv, seen = server
    result = await asyncio.to_thread(run_trial, _request(srv.url))
    assert result.status == "ok", result.failure_reason
    assert len(seen.times("/metrics")) >= 2  # before and after the load at least
    prompt = sum(lg.prompt_tokens for lg in srv.log.values())
    assert result.summary.prefix_hit_rate_server == pytest.approx(3 * len(srv.log) / prompt)
    assert result.summary.server_samples >= 1


async def test_no_flush_when_disabled_and_a_missing_endpoint_is_not_an_error():
    srv, seen = await _serve(Scenario(ttft_ms=5, gap_ms=1), flush=False, metrics=False)
    try:
        result = await asyncio.to_thread(run_trial, _request(srv.url, num_requests=3))
        assert result.status == "ok", result.failure_reason
        assert result.server["flush_cache"]["supported"] is False
        assert result.summary.prefix_hit_rate_server is None  # no /metrics: unknown, not 0

        before = len(seen.times("/flush_cache"))
        result = await asyncio.to_thread(run_trial, _request(srv.url, num_requests=3, flush_cache=False))
        assert len(seen.times("/flush_cache")) == before and "flush_cache" not in result.server
    finally:
        await srv.stop()


async def test_a_failing_preflight_fails_the_trial_and_sends_nothing(server):
    srv, seen = server

    def dirty_gpu() -> None:
        raise RuntimeError("GPU 0 is held by pid 4242 (python)")

    result = await asyncio.to_thread(run_trial, _request(srv.url), preflight=dirty_gpu)
    assert result.status == "failed"
    assert "GPU 0 is held by pid 4242" in result.failure_reason
    assert seen.generations == [] and seen.times("/flush_cache") == []
    assert result.records == [] and result.summary.requests_total == 0


async def test_every_request_failing_fails_the_trial_with_the_cause(server):
    srv, seen = server
    bad = Target(url=srv.url, extra_body={"messages": [{"role": "user", "content": "[fail:500]"}]})
    result = await asyncio.to_thread(run_trial, _request(srv.url, target=bad, num_requests=4))
    assert result.status == "failed"
    assert "every measured request failed" in result.failure_reason and "http_5xx: 4" in result.failure_reason
    assert result.summary.error_rate == 1.0 and len(result.records) == 6


async def test_a_target_that_dies_during_the_trial_fails_it(server):
    srv, seen = server
    loop = asyncio.get_running_loop()
    total = 2 + 6

    def kill_when_done(done: int, errors: int, tokens: int) -> None:
        if done == total:  # the last response is in: take the server away before the post-load check
            asyncio.run_coroutine_threadsafe(srv.stop(), loop).result(timeout=10)

    result = await asyncio.to_thread(
        lambda: run_trial(_request(srv.url, num_requests=6), progress=kill_when_done)
    )
    assert result.status == "failed"
    assert "stopped answering" in result.failure_reason
    assert result.summary.requests_ok == 6  # what was measured is kept


async def test_unreachable_target_raises_before_anything():
    req = _request(f"http://127.0.0.1:{_closed_port()}")
    with pytest.raises(TargetUnreachable, match="unreachable"):
        await asyncio.to_thread(run_trial, req)


def test_invalid_requests_name_the_field(tmp_path):
    with pytest.raises(ValidationError, match="num_requests"):
        _request("http://127.0.0.1:1", num_requests=0)
    with pytest.raises(ValidationError, match="tokenizer"):
        _request("http://127.0.0.1:1", tokenizer=str(tmp_path / "missing"))
    with pytest.raises(ValidationError, match="gpu_interval_ms"):
        _request("http://127.0.0.1:1", gpu_interval_ms=0)
