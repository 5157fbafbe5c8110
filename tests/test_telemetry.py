"""Telemetry: /metrics parsing and scraping against real HTTP servers, server info, environment, NVML off."""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
from pathlib import Path

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from servetune.telemetry.environment import fingerprint
from servetune.telemetry.nvml import GpuSampler, GpuUnavailable, gpu_memory_used, gpu_processes
from servetune.telemetry.prometheus import MetricsScraper, MetricsUnavailable, derive_signals, parse_metrics
from servetune.telemetry.redact import redact
from servetune.telemetry.server_info import fetch_server_info

SAMPLE = (Path(__file__).parent / "data" / "sglang-metrics-sample-0.5.23.txt").read_text()


RANKS = 'engine_type="unified",model_name="Qwen/Qwen3-8B",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
PROMPT_LINE = (
    'sglang:prompt_tokens_total{engine_type="unified",is_streaming="true",model_name="Qwen/Qwen3-8B"} '
)
CACHED_LINE = (
    'sglang:cached_tokens_total{cache_source="device",engine_type="unified",model_name="Qwen/Qwen3-8B"} '
)
QUEUE_LINE = "sglang:num_queue_reqs{" + RANKS + "} "
RETRACTED_LINE = "sglang:num_retracted_requests_total{" + RANKS + "} "


def _with_counters(prompt: float, cached: float, *, queue: float, retracted: float) -> str:
    """The sample exposition with three values replaced and a retraction counter added (the
    sample declares that family without a series); a line that is not found fails loudly."""
    replace = {PROMPT_LINE: prompt, CACHED_LINE: cached, QUEUE_LINE: queue}
    lines, hit = [], set()
    for line in SAMPLE.splitlines():
        for head, value in replace.items():
            if line.startswith(head):
                line, _ = head + repr(float(value)), hit.add(head)
        lines.append(line)
        if line == "# TYPE sglang:num_retracted_requests_total counter":
            lines.append(RETRACTED_LINE + repr(float(retracted)))
            hit.add(RETRACTED_LINE)
    assert hit == set(replace) | {RETRACTED_LINE}, set(replace) - hit
    return "\n".join(lines) + "\n"


async def _serve(routes: dict[str, object]) -> TestServer:
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_get(path, handler)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    return server


# --- parsing -----------------------------------------------------------------------------------
def test_parse_keeps_engine_families_with_colon_names():
    snap = parse_metrics(SAMPLE)
    assert not any(name.startswith(("python_", "process_")) for name in snap)
    assert snap["sglang:num_running_reqs"][0]["value"] == 12.0
    assert snap["sglang:num_running_reqs"][0]["labels"]["tp_rank"] == "0"
    assert snap["sglang:prompt_tokens_total"][0] == {
        "labels": {"engine_type": "unified", "is_streaming": "true", "model_name": "Qwen/Qwen3-8B"},
        "value": 1000.0,
    }
    assert snap["sglang:cached_tokens_total"][0]["labels"]["cache_source"] == "device"
    assert (
        "sglang:time_to_first_token_seconds_sum" in snap
        and "sglang:time_to_first_token_seconds_count" in snap
    )
    assert not any(name.endswith(("_bucket", "_created")) for name in snap)
    assert "sglang:spec_accept_rate" not in snap  # not a family we keep


def test_parse_rejects_garbage():
    with pytest.raises(MetricsUnavailable, match="not a Prometheus text exposition"):
        parse_metrics("sglang:num_running_reqs{oops 3\n")


# --- scraping a real server --------------------------------------------------------------------
async def test_snapshot_of_the_sample_served_over_http():
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=SAMPLE, content_type="text/plain")

    server = await _serve({"/metrics": metrics})
    try:
        snap = await MetricsScraper(str(server.make_url("/"))).snapshot()
    finally:
        await server.close()
    assert snap == parse_metrics(SAMPLE)
    assert snap["sglang:cache_hit_rate"][0]["value"] == 0.62


async def test_run_gives_delta_hit_rate_and_gauge_timeline():
    """The server stops the scraper itself after its 4th scrape: no timing assumptions."""
    stop = asyncio.Event()
    scrapes = 0

    async def metrics(_: web.Request) -> web.Response:
        nonlocal scrapes
        scrapes += 1
        if scrapes == 4:
            stop.set()
        if scrapes == 1:  # before: 1000 prompt, 600 cached (the sample), queue 1
            return web.Response(text=_with_counters(1000.0, 600.0, queue=1.0, retracted=2.0))
        # during and after: +2000 prompt tokens of which +500 cached; queue = scrape number
        return web.Response(text=_with_counters(3000.0, 1100.0, queue=float(scrapes), retracted=5.0))

    server = await _serve({"/metrics": metrics})
    try:
        out = await MetricsScraper(str(server.make_url("/")), interval_s=0.01).run(stop)
    finally:
        await server.close()
    assert out["metrics_state"] == "ok" and out["metrics_reason"] is None and scrapes == 5
    assert out["metrics_before"]["sglang:prompt_tokens_total"][0]["value"] == 1000.0
    assert out["metrics_after"]["sglang:prompt_tokens_total"][0]["value"] == 3000.0
    ts = [s["t_s"] for s in out["samples"]]
    assert ts == sorted(ts)
    sig = derive_signals(out)
    assert sig["prefix_hit_rate_server"] == pytest.approx(500 / 2000)
    assert sig["cache_hit_rate_gauge"] == pytest.approx(0.62)  # the misleading gauge, for contrast
    assert sig["samples"] == 5
    assert sig["queue_reqs_max"] == 5.0 and sig["queue_reqs_mean"] == pytest.approx((1 + 2 + 3 + 4 + 5) / 5)
    assert sig["running_reqs_mean"] == 12.0
    assert sig["token_usage_max"] == pytest.approx(0.41)
    assert sig["retractions"] == 3.0 and sig["retractions_source"] == "sglang:num_retracted_requests_total"


async def test_start_stop_form_matches_the_trial_glue():
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=SAMPLE)

    server = await _serve({"/metrics": metrics})
    try:
        scraper = MetricsScraper(str(server.make_url("/")), interval_s=5.0)
        await scraper.start(t0_ns=0)
        out = await scraper.stop()
    finally:
        await server.close()
    assert out["metrics_state"] == "ok" and out["metrics_after"] is not None
    assert all(s["t_s"] > 0 for s in out["samples"])  # relative to the given t0 (0 ns)


async def test_server_without_metrics_is_stated_not_raised():
    async def hello(_: web.Request) -> web.Response:
        return web.Response(text="hi")

    server = await _serve({"/health": hello})
    try:
        out = await MetricsScraper(str(server.make_url("/"))).run(asyncio.Event())
    finally:
        await server.close()
    assert out["metrics_state"] == "unavailable"
    assert "HTTP 404" in out["metrics_reason"] and "--enable-metrics" in out["metrics_reason"]
    sig = derive_signals(out)
    assert sig["prefix_hit_rate_server"] is None and sig["samples"] == 0 and "404" in sig["reason"]


async def test_unreachable_server_is_stated_not_raised():
    server = await _serve({})
    url = str(server.make_url("/"))
    await server.close()  # nothing listens there any more
    out = await MetricsScraper(url).run(asyncio.Event())
    assert out["metrics_state"] == "unavailable" and "ClientConnectorError" in out["metrics_reason"]


async def test_scrape_failing_mid_run_is_partial():
    stop = asyncio.Event()
    n = 0

    async def metrics(_: web.Request) -> web.Response:
        nonlocal n
        n += 1
        if n == 2:
            stop.set()
        return web.Response(text=SAMPLE) if n == 1 else web.Response(status=503)

    server = await _serve({"/metrics": metrics})
    try:
        out = await MetricsScraper(str(server.make_url("/")), interval_s=0.01).run(stop)
    finally:
        await server.close()
    assert out["metrics_state"] == "partial" and out["metrics_after"] is None
    assert out["scrape_errors"] == 1 and "final snapshot" in out["metrics_reason"]
    assert derive_signals(out)["prefix_hit_rate_server"] is None


# --- derive_signals on other shapes ------------------------------------------------------------
def _vllm_exposition(hits: float, queries: float, preempt: float, waiting: float) -> str:
    reg = CollectorRegistry()
    Counter("vllm:prefix_cache_hits", "hits", ["model_name"], registry=reg).labels("m").inc(hits)
    Counter("vllm:prefix_cache_queries", "queries", ["model_name"], registry=reg).labels("m").inc(queries)
    Counter("vllm:num_preemptions", "preemptions", ["model_name"], registry=reg).labels("m").inc(preempt)
    Gauge("vllm:num_requests_waiting", "waiting", ["model_name"], registry=reg).labels("m").set(waiting)
    Gauge("vllm:kv_cache_usage_perc", "usage", ["model_name"], registry=reg).labels("m").set(
        0.5 + waiting / 100
    )
    Histogram("vllm:time_to_first_token_seconds", "ttft", ["model_name"], registry=reg).labels("m").observe(
        0.25 * (queries > 0)
    )
    return generate_latest(reg).decode()


def test_vllm_prefix_cache_counters():
    before = parse_metrics(_vllm_exposition(10, 100, 0, 2))
    after = parse_metrics(_vllm_exposition(70, 300, 4, 7))
    samples = [
        {"t_s": t, "name": s_name, "labels": s["labels"], "value": s["value"]}
        for t, snap in ((0.0, before), (1.0, after))
        for s_name in ("vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
        for s in snap[s_name]
    ]
    sig = derive_signals({"metrics_before": before, "metrics_after": after, "samples": samples})
    assert sig["prefix_hit_rate_server"] == pytest.approx(60 / 200)
    assert sig["retractions"] == 4.0 and sig["retractions_source"] == "vllm:num_preemptions_total"
    assert sig["queue_reqs_max"] == 7.0 and sig["token_usage_max"] == pytest.approx(0.57)
    assert sig["cache_hit_rate_gauge"] is None


def test_total_cache_source_wins_and_ranks_collapse():
    def snap(cached_total: float, device: float, prompt: float) -> dict:
        return {
            "sglang:prompt_tokens_total": [{"labels": {"is_streaming": "true"}, "value": prompt}],
            "sglang:cached_tokens_total": [
                {"labels": {"cache_source": "device"}, "value": device},
                {"labels": {"cache_source": "host"}, "value": 50.0},
                {"labels": {"cache_source": "total"}, "value": cached_total},
            ],
        }

    def gauge(t: float, dp: str, tp: str, v: float) -> dict:
        return {
            "t_s": t,
            "name": "sglang:num_running_reqs",
            "labels": {"dp_rank": dp, "tp_rank": tp},
            "value": v,
        }

    # two dp replicas, each with two tp ranks reporting the same scheduler value
    samples = [gauge(0.0, d, t, v) for d, v in (("0", 4.0), ("1", 6.0)) for t in ("0", "1")]
    samples += [gauge(1.0, d, t, v) for d, v in (("0", 8.0), ("1", 2.0)) for t in ("0", "1")]
    sig = derive_signals(
        {"metrics_before": snap(100, 80, 1000), "metrics_after": snap(400, 300, 2000), "samples": samples}
    )
    assert sig["prefix_hit_rate_server"] == pytest.approx(300 / 1000)
    assert sig["running_reqs_mean"] == pytest.approx(10.0)  # (4+6 + 8+2)/2, tp ranks not double counted


def test_counter_reset_gives_no_rate():
    before = {
        "sglang:prompt_tokens_total": [{"labels": {}, "value": 5000.0}],
        "sglang:cached_tokens_total": [{"labels": {"cache_source": "device"}, "value": 100.0}],
    }
    after = {
        "sglang:prompt_tokens_total": [{"labels": {}, "value": 10.0}],
        "sglang:cached_tokens_total": [{"labels": {"cache_source": "device"}, "value": 5.0}],
    }
    assert (
        derive_signals({"metrics_before": before, "metrics_after": after})["prefix_hit_rate_server"] is None
    )


# --- server info -------------------------------------------------------------------------------
async def test_server_info_from_sglang_drops_secrets_and_needs_the_key():
    async def info(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != "Bearer s3cret":
            return web.json_response({"error": "unauthorized"}, status=401)
        return web.json_response(
            {
                "version": "0.5.23",
                "api_key": "s3cret",
                "admin_api_key": "x",
                "chunked_prefill_size": 8192,
                "max_total_tokens": None,
                "internal_states": [{"last_gen_throughput": 10.0}],
            }
        )

    server = await _serve({"/server_info": info})
    try:
        url = str(server.make_url("/"))
        got = await fetch_server_info(url, api_key="s3cret")
        refused = await fetch_server_info(url)
    finally:
        await server.close()
    assert got["engine"] == "sglang" and got["version"] == "0.5.23" and got["source"] == "/server_info"
    assert got["chunked_prefill_size"] == 8192 and "max_total_tokens" in got
    assert "api_key" not in got and "admin_api_key" not in got and "s3cret" not in orjson.dumps(got).decode()
    assert set(refused) == {"reason"} and "HTTP 401" in refused["reason"]


async def test_server_info_falls_back_to_old_path_and_to_vllm():
    async def old(_: web.Request) -> web.Response:
        return web.json_response({"version": "0.4.0", "tp_size": 2})

    async def version(_: web.Request) -> web.Response:
        return web.json_response({"version": "0.11.0"})

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "tiny", "max_model_len": 4096}]})

    sg = await _serve({"/get_server_info": old})
    vl = await _serve({"/version": version, "/v1/models": models})
    try:
        old_info = await fetch_server_info(str(sg.make_url("/")))
        vllm_info = await fetch_server_info(str(vl.make_url("/")))
    finally:
        await sg.close()
        await vl.close()
    assert old_info["source"] == "/get_server_info" and old_info["tp_size"] == 2
    assert vllm_info["engine"] == "vllm" and vllm_info["version"] == "0.11.0"
    assert vllm_info["models"][0]["max_model_len"] == 4096


# --- environment -------------------------------------------------------------------------------
def test_environment_fingerprint(tmp_path):
    model = tmp_path / "tiny-model"
    model.mkdir()
    (model / "config.json").write_bytes(b'{"hidden_size": 128}')
    (model / "tokenizer_config.json").write_text(orjson.dumps({"chat_template": "{{ messages }}"}).decode())
    info = {
        "engine": "sglang",
        "version": "0.5.23",
        "api_key": "k",
        "chunked_prefill_size": 8192,
        "internal_states": [{"last_gen_throughput": 1.0}],
    }
    device = {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-1", "mem_total": 1 << 37}
    gpu = {"state": "ok", "devices": [device | {"driver": "580.159.03", "cuda": "13.0"}]}
    env = fingerprint(gpu=gpu, server_info=info, model_path=str(model), prompt_template=None)
    assert env["gpu_model"] == "NVIDIA H200" and env["gpu_uuids"] == ["GPU-1"] and env["cuda"] == "13.0"
    assert env["engine"] == "sglang" and env["engine_version"] == "0.5.23"
    assert env["server_args"] == {"chunked_prefill_size": 8192}  # no secrets, no volatile state
    assert env["model_config_hash"] == hashlib.sha256(b'{"hidden_size": 128}').hexdigest()
    assert env["prompt_template_hash"] == hashlib.sha256(b"{{ messages }}").hexdigest()
    assert env["prompt_template_source"] == "model"
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent, check=True
    ).stdout.strip()
    assert env["git_sha"] == head and env["python"] and env["host"]
    # what must match for comparison changes when a server argument does
    other = fingerprint(gpu=gpu, server_info=info | {"chunked_prefill_size": 4096}, model_path=str(model))
    assert other["environment_hash"] != env["environment_hash"]
    inline = fingerprint(prompt_template="{% for m in messages %}{{ m }}{% endfor %}")
    assert inline["prompt_template_source"] == "inline" and inline["gpu_model"] is None
    no_gpu = fingerprint(gpu=GpuSampler().start().stop(), engine="sim")
    assert (
        no_gpu["gpu_state"] == "no_gpu" and no_gpu["engine"] == "sim" and no_gpu["model_config_hash"] is None
    )


def test_redact_is_recursive_and_keeps_token_counts():
    data = {
        "api_key": "a",
        "nested": [{"hf_token": "b", "max_tokens": 5}],
        "tokenizer_path": "/m",
        "Password": "c",
    }
    assert redact(data) == {"nested": [{"max_tokens": 5}], "tokenizer_path": "/m"}


# --- NVML on a machine without it --------------------------------------------------------------
def test_gpu_sampler_without_nvml_states_no_gpu():
    sampler = GpuSampler(interval_s=0.05)
    out = sampler.start(0).stop()
    assert out["state"] == "no_gpu" and "LibraryNotFound" in out["reason"]
    assert out["samples"] == [] and out["devices"] == [] and out["interval_ms"] == 50.0
    with GpuSampler() as s:
        pass
    assert s.result()["state"] == "no_gpu"
    with pytest.raises(GpuUnavailable, match="NVML unavailable"):
        gpu_processes([0])
    with pytest.raises(GpuUnavailable):
        gpu_memory_used()
    with pytest.raises(ValueError, match="interval_s"):
        GpuSampler(interval_s=0)
