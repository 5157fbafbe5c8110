"""The simulated server's HTTP surface, read by servetune's own load generator and scraper.

In-process servers (aiohttp test server on a free loopback port) for the functional checks; one
real ``python -m servetune sim serve`` subprocess for the runner contract (flag rejection,
503 while loading, /health_generate), real-time emission accuracy and virtual/real agreement.
"""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

import sim_process
from servetune.loadgen import LoadConfig, Target, run_load
from servetune.sim import server_args_from_flags, simulate
from servetune.sim.server import SimServer
from servetune.telemetry.prometheus import MetricsScraper
from servetune.workload import build_requests
from servetune.workload.spec import Fixed, Images, SharedPrefix, Uniform, WorkloadSpec

SAMPLE = Path(__file__).parent / "data" / "sglang-metrics-sample-0.5.23.txt"
REPO = Path(__file__).resolve().parents[1]


async def _start(flags: dict) -> tuple[TestServer, SimServer]:
    sim = SimServer(server_args_from_flags({"load_seconds": 0.0, **flags}))
    server = TestServer(sim.app, host="127.0.0.1", port=0)
    await server.start_server()
    await asyncio.sleep(0.01)  # let the zero-length loading phase end
    return server, sim


@pytest.fixture
async def sim_server() -> AsyncIterator[tuple[str, SimServer]]:
    server, sim = await _start({"enable_metrics": True, "enable_cache_report": True})
    yield f"http://127.0.0.1:{server.port}", sim
    await server.close()


def _shared_prefix_requests(n: int) -> list:
    spec = WorkloadSpec(input=Uniform(min=200, max=600), output=Uniform(min=8, max=40),
                        shared_prefix=SharedPrefix(tokens=150, num_prefixes=1), seed=11)
    return build_requests(spec, n).requests


@pytest.mark.parametrize("endpoint", ["chat", "completions", "generate"])
async def test_loadgen_reads_every_endpoint(sim_server: tuple[str, SimServer], endpoint: str) -> None:
    url, _ = sim_server
    reqs = _shared_prefix_requests(12)
    out = await run_load(Target(url=url, endpoint=endpoint), reqs, LoadConfig(concurrency=4, warmup_requests=2),
                         t0_ns=time.perf_counter_ns())
    for req, rec in zip(reqs, out.records, strict=True):
        assert rec.ok, rec.error_message
        assert rec.completion_tokens == req.output_tokens
        assert sum(rec.chunk_tokens) == req.output_tokens == len(rec.chunk_offsets_ms)
        words = len(req.prompt_text().split())
        if endpoint == "chat":  # 4 template tokens per message + 3 for the assistant header
            assert rec.prompt_tokens == words + 4 * len(req.chat_messages()) + 3
        else:
            assert rec.prompt_tokens == words
        assert rec.ttft_ms is not None and 0 < rec.ttft_ms <= rec.e2e_ms
    source = {"generate": "meta_info"}.get(endpoint, "apportioned")
    assert {r.token_count_source for r in out.records} == {source}
    # the shared system prompt is cached after the first requests (--enable-cache-report)
    assert max(r.cached_tokens for r in out.records[4:]) >= 150


async def test_metrics_match_sglang_names_types_and_labels(sim_server: tuple[str, SimServer]) -> None:
    url, _ = sim_server
    scraper = MetricsScraper(url)
    before = await scraper.snapshot()
    reqs = _shared_prefix_requests(10)
    out = await run_load(Target(url=url, endpoint="chat"), reqs, LoadConfig(concurrency=5),
                         t0_ns=time.perf_counter_ns())
    after = await scraper.snapshot()

    def delta(name: str, **where: str) -> float:
        tot = 0.0
        for s in after[name]:
            if all(s["labels"].get(k) == v for k, v in where.items()):
                prev = [b["value"] for b in before.get(name, []) if b["labels"] == s["labels"]]
                tot += s["value"] - (prev[0] if prev else 0.0)
        return tot

    assert delta("sglang:prompt_tokens_total") == sum(r.prompt_tokens for r in out.records)
    assert delta("sglang:generation_tokens_total") == sum(r.completion_tokens for r in out.records)
    assert delta("sglang:cached_tokens_total", cache_source="total") == sum(r.cached_tokens for r in out.records)
    assert delta("sglang:num_requests_total", is_streaming="true") == 10
    assert delta("sglang:time_to_first_token_seconds_count") == 10
    # every family we expose has SGLang 0.5.23's type and label names
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as resp:
        ours = {f.name: f for f in text_string_to_metric_families(await resp.text())}
    ref = {f.name: f for f in text_string_to_metric_families(SAMPLE.read_text())}
    checked = 0
    for name, fam in ours.items():
        assert name in ref, f"{name} is not an SGLang 0.5.23 metric"
        assert fam.type == ref[name].type, name
        if fam.samples and ref[name].samples:
            ours_labels = {k for smp in fam.samples for k in smp.labels} - {"le", "mode", "cache_source"}
            ref_labels = {k for smp in ref[name].samples for k in smp.labels} - {"le", "mode", "cache_source"}
            assert ours_labels == ref_labels, name
            checked += 1
    assert checked >= 8
    assert {"sglang:num_running_reqs", "sglang:token_usage", "sglang:cache_hit_rate", "sglang:gen_throughput",
            "sglang:num_retracted_reqs", "sglang:realtime_tokens", "sglang:e2e_request_latency_seconds",
            "sglang:inter_token_latency_seconds"} <= ours.keys()


async def test_api_key_enforced_except_health_and_metrics() -> None:
    server, _ = await _start({"api_key": "sekret", "enable_metrics": True})
    base = f"http://127.0.0.1:{server.port}"
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    try:
        async with aiohttp.ClientSession() as s:
            async with s.post(base + "/v1/chat/completions", json=body) as r:
                assert r.status == 401
            async with s.post(base + "/v1/chat/completions", json=body,
                              headers={"Authorization": "Bearer wrong"}) as r:
                assert r.status == 401
            async with s.post(base + "/v1/chat/completions", json=body,
                              headers={"Authorization": "Bearer sekret"}) as r:
                assert r.status == 200 and (await r.json())["usage"]["completion_tokens"] == 2
            for path in ("/health", "/metrics", "/health_generate"):
                async with s.get(base + path) as r:
                    assert r.status == 200, path
            async with s.get(base + "/server_info", headers={"Authorization": "Bearer sekret"}) as r:
                info = await r.json()
                assert info["api_key"] == "***" and "sekret" not in await r.text()
    finally:
        await server.close()


async def test_loading_phase_answers_503_then_serves() -> None:
    # loading outlasts any stall of a busy machine; the test ends it (the timer: test_server_process_loads...)
    sim = SimServer(server_args_from_flags({"load_seconds": 60}))
    server = TestServer(sim.app, host="127.0.0.1", port=0)
    await server.start_server()
    base = f"http://127.0.0.1:{server.port}"
    try:
        async with aiohttp.ClientSession() as s:
            for path in ("/health", "/health_generate"):
                async with s.get(base + path) as r:
                    assert r.status == 503
            async with s.post(base + "/generate", json={"text": "a b", "sampling_params": {"max_new_tokens": 2}}) as r:
                assert r.status == 503
            sim._set_ready()  # what the load_seconds timer calls
            async with s.get(base + "/health_generate") as r:
                assert r.status == 200
            async with s.post(base + "/generate", json={"text": "a b", "sampling_params": {"max_new_tokens": 2}}) as r:
                meta = (await r.json())["meta_info"]
                assert (meta["prompt_tokens"], meta["completion_tokens"]) == (2, 2)
    finally:
        await server.close()


async def test_info_flush_cache_and_bad_requests(sim_server: tuple[str, SimServer]) -> None:
    url, sim = sim_server
    prompt = {"prompt": " ".join(f"p{i}" for i in range(300)), "max_tokens": 3}
    async with aiohttp.ClientSession() as s:
        async with s.get(url + "/server_info") as r:
            info = await r.json()
        assert info["max_total_num_tokens"] == sim.args.max_total_num_tokens and info["version"] == "0.5.23"
        assert info["internal_states"][0]["effective_max_running_requests_per_dp"] == 2048
        async with s.get(url + "/model_info") as r:
            assert (await r.json())["model_path"] == "meta-llama/Llama-3.1-8B-Instruct"
        cached = []
        for _ in range(2):
            async with s.post(url + "/v1/completions", json=prompt) as r:
                cached.append((await r.json())["usage"]["prompt_tokens_details"]["cached_tokens"])
        async with s.post(url + "/flush_cache") as r:
            assert r.status == 200
        async with s.post(url + "/v1/completions", json=prompt) as r:
            cached.append((await r.json())["usage"]["prompt_tokens_details"]["cached_tokens"])
        assert cached == [0, 299, 0]
        async with s.post(url + "/v1/chat/completions", data=b"{not json") as r:
            assert r.status == 400 and "JSON" in (await r.json())["message"]
        async with s.post(url + "/v1/chat/completions", json={"messages": [], "max_tokens": 1}) as r:
            assert r.status == 400
        long = {"prompt": "x " * 200_000, "max_tokens": 1}
        async with s.post(url + "/v1/completions", json=long) as r:
            assert r.status == 400 and "context length" in (await r.json())["message"]
        for image_url, why in (("http://127.0.0.1:9/cat.png", "cannot fetch image http://127.0.0.1:9/cat.png"),
                               ("data:image/png,raw", "must be base64"),
                               ("data:image/png;base64,bm90IGFu", "cannot read")):
            body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "what is it"},
                                                             {"type": "image_url", "image_url": {"url": image_url}}]}],
                    "max_tokens": 1}
            async with s.post(url + "/v1/chat/completions", json=body) as r:
                assert r.status == 400 and why in (await r.json())["message"]  # a bad image is the client's error


async def test_vlm_images_cost_tokens_and_are_cached_by_hash() -> None:
    server, _ = await _start({"model_profile": "llava-8b", "enable_cache_report": True})
    base = f"http://127.0.0.1:{server.port}"
    spec = WorkloadSpec(input=Fixed(value=50), output=Fixed(value=4), seed=4,
                        images=Images(count=1, width=512, height=512, distinct=1))
    reqs = build_requests(spec, 3).requests
    try:
        out = await run_load(Target(url=base, endpoint="chat"), reqs, LoadConfig(concurrency=1),
                             t0_ns=time.perf_counter_ns())
    finally:
        await server.close()
    image_tokens = 1338  # ceil(512 * 512 / 196), within the profile's 576..1400
    for req, rec in zip(reqs, out.records, strict=True):
        assert rec.ok, rec.error_message
        assert rec.prompt_tokens == len(req.prompt_text().split()) + image_tokens + 4 * len(req.chat_messages()) + 3
    # the same image (distinct=1) is a cache hit from the second request on
    assert out.records[0].cached_tokens < image_tokens <= out.records[1].cached_tokens


# --- a real server process -------------------------------------------------------------------


def test_unknown_flags_are_rejected_like_sglang() -> None:
    cmd = [sys.executable, "-m", "servetune", "sim", "serve", "--model-profile", "llama-3.1-8b",
           "--cuda-graph-max-bs", "8"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert p.returncode == 2
    assert "unrecognized arguments: --cuda-graph-max-bs 8" in p.stderr
    p = subprocess.run([*cmd[:5], "--schedule-policy", "nope"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert p.returncode == 2 and "invalid choice" in p.stderr


@pytest.fixture(scope="module")
def server_process(tmp_path_factory) -> Iterator[tuple[str, bool, float]]:
    # 5 s of loading: long enough that even a starved poller sees a 503 in it
    with sim_process.sim_server(tmp_path_factory.mktemp("sim"), "--load-seconds", "5", "--enable-metrics",
                                "--enable-cache-report", ready_path="/health_generate", poll_s=0.05) as server:
        yield server.url, server.saw_503, server.ready_s


def test_server_process_loads_then_is_ready(server_process) -> None:
    url, saw_503, _ = server_process
    assert saw_503  # /health_generate said 503 during the simulated loading phase


def test_real_time_matches_virtual_time_and_emits_on_time(server_process) -> None:
    """The real-time server serves what virtual time predicts for the sends the client really made. A host
    too busy to keep the simulator's schedule moves it later; the server measures that slip and reports it
    (``sim_slip_ms``), and the comparison allows exactly that much, so its verdict holds at any load."""
    url, _, _ = server_process
    spec = WorkloadSpec(input=Uniform(min=200, max=1500), output=Uniform(min=20, max=60), seed=9)
    reqs = build_requests(spec, 48).requests
    load = LoadConfig(concurrency=16, warmup_requests=0)
    real = asyncio.run(run_load(Target(url=url, endpoint="chat"), reqs, load, t0_ns=time.perf_counter_ns()))
    assert all(r.ok for r in real.records)
    # the same requests at the moments the client sent them (a trace), in virtual time
    sent = {r.request_id: r.t_send_s for r in real.records}
    first = min(sent.values())
    trace = [dataclasses.replace(q, arrival_s=sent[q.index] - first) for q in reqs]
    virt = simulate({}, trace, LoadConfig(mode="rate", arrival="trace", concurrency=16)).records
    import json
    import urllib.request

    with urllib.request.urlopen(url + "/server_info", timeout=5) as r:
        state = json.loads(r.read())["internal_states"][0]
    slip_ms = state["sim_slip_ms"].get("total", 0.0)
    assert 0.0 <= slip_ms <= max(r.t_send_s * 1e3 + r.e2e_ms for r in real.records)  # within the run's length
    for name, of in (("tpot", lambda r: r.tpot_ms()), ("ttft", lambda r: r.ttft_ms), ("e2e", lambda r: r.e2e_ms)):
        got, want = np.median([of(r) for r in real.records]), np.median([of(r) for r in virt])
        assert abs(got - want) <= 0.10 * want + slip_ms, (name, got, want, slip_ms)
    err, wake = state["sim_emission_error_ms"], state["sim_wake_error_ms"]
    assert err["count"] >= sum(len(r.chunk_offsets_ms) for r in real.records)
    # a token leaves when its iteration's modelled end comes, so a write is late only as far as the engine woke
    # late (a busy host); how close both are on an idle host is bench/sim_speed.py's figure, not this test's.
    assert err["p50"] <= wake["p99"] + 1.0, (err, wake)
