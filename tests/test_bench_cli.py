"""``servetune bench`` end to end against a real streaming HTTP server, through Typer's CliRunner.

The CLI's own event loop runs in a worker thread; the server runs on the test's loop.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from servetune.cli import app
from sim_process import sim_server
from sse_server import Scenario
from test_trial import _serve

TINY = "name: tiny\nseed: 3\ninput: {kind: fixed, value: 32}\noutput: {kind: fixed, value: 8}\n"


@pytest.fixture
async def server():
    srv, seen = await _serve(Scenario(ttft_ms=10, gap_ms=2, tokens_per_chunk=2))
    yield srv, seen
    await srv.stop()


async def _bench(*args: str):
    return await asyncio.to_thread(CliRunner().invoke, app, ["bench", *args])


def _tiny(tmp_path: Path) -> str:
    p = tmp_path / "tiny.yaml"
    p.write_text(TINY)
    return str(p)


async def test_bench_writes_a_complete_result(server, tmp_path):
    srv, seen = server
    out = tmp_path / "res" / "result.json"
    out.parent.mkdir()  # --out's folder must exist (servetune.commands.outpath)
    r = await _bench(
        "--url",
        srv.url,
        "--concurrency",
        "4",
        "--requests",
        "12",
        "--warmup",
        "2",
        "--out",
        str(out),
        "--workload",
        _tiny(tmp_path),
        "--model",
        "sse-test",
        "--sla",
        "ttft_ms=5000",
        "--sla",
        "tpot_ms=1000",
        "--gpu-interval-ms",
        "20",
        "--read-batch-ms",
        "0.5",
    )
    assert r.exit_code == 0, r.output
    assert "TTFT" in r.output and "output tokens/s" in r.output and "result written to" in r.output
    d = orjson.loads(out.read_bytes())
    s = d["summary"]
    assert d["schema"] == "servetune.trial/1" and d["status"] == "ok"
    assert s["ttft_ms"]["p50"] >= 10.0 and s["itl_ms"]["p99"] > 0 and s["output_tokens_per_s"] > 0
    assert s["requests_measured"] == 12 and s["requests_warmup"] == 2 and s["error_rate"] == 0.0
    assert s["sla"] == {"ttft_ms": 5000.0, "tpot_ms": 1000.0} and s["goodput_fraction"] == 1.0
    assert s["output_len"]["p50"] == 8 and s["gpu_state"] == "no_gpu"
    assert len(d["records"]) == 14 and all(rec["ttft_ms"] < rec["e2e_ms"] for rec in d["records"])
    assert d["workload"]["spec"]["name"] == "tiny" and d["workload"]["fingerprint"]
    assert d["load"]["concurrency"] == 4 and d["load"]["mode"] == "concurrency"
    assert d["load"]["http_client"] == "raw"  # http://: the raw client
    assert d["target"]["read_batch_ms"] == 0.5
    assert d["load"]["arrival_stamps"] == ("kernel" if sys.platform == "linux" else "client")
    assert "samples" in d["gpu"] and d["environment"]
    assert len(seen.generations) == 14


async def test_default_workload_and_rate_mode(server, tmp_path):
    srv, seen = server
    out = tmp_path / "r.json"
    r = await _bench(
        "--url",
        srv.url,
        "--concurrency",
        "2",
        "--requests",
        "3",
        "--warmup",
        "0",
        "--out",
        str(out),
        "--rate",
        "50",
        "--arrival",
        "constant",
        "--endpoint",
        "completions",
        "--http-client",
        "aiohttp",
    )
    assert r.exit_code == 0, r.output
    d = orjson.loads(out.read_bytes())
    assert d["workload"]["spec"]["name"] == "chat-default"
    assert d["load"]["mode"] == "rate" and d["load"]["rate"] == 50.0 and d["load"]["arrival"] == "constant"
    assert d["target"]["http_client"] == d["load"]["http_client"] == "aiohttp"  # pinned, and used
    assert d["target"]["endpoint"] == "completions" and d["summary"]["requests_ok"] == 3


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


BAD_WORKLOADS = {
    "malformed": ("input: {kind: lognormal, median: -5, sigma: 0.5}\n", "input"),
    "unknown_distribution": ("input: {kind: zipf, value: 3}\n", "input"),
    "not_yaml": ("input: [unclosed\n", "YAML"),
    "unknown_field": ("inputs: {kind: fixed, value: 3}\n", "inputs"),
}


@pytest.mark.parametrize("case", sorted(BAD_WORKLOADS))
async def test_bad_workload_files_name_the_cause_and_send_nothing(server, tmp_path, case):
    srv, seen = server
    text, expect = BAD_WORKLOADS[case]
    wl = tmp_path / "w.yaml"
    wl.write_text(text)
    r = await _bench(
        "--url",
        srv.url,
        "--concurrency",
        "2",
        "--requests",
        "2",
        "--out",
        str(tmp_path / "o.json"),
        "--workload",
        str(wl),
    )
    assert r.exit_code == 2, r.output
    assert "error:" in r.output and expect in r.output and str(wl) in r.output
    assert seen.calls == [] and not (tmp_path / "o.json").exists()


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["--concurrency", "0"], "--concurrency"),
        (["--concurrency", "-3"], "--concurrency"),
        (["--requests", "0"], "--requests"),
        (["--arrival", "zipf", "--rate", "5"], "--arrival"),
        (["--rate", "-1"], "--rate"),
        (["--endpoint", "embeddings"], "--endpoint"),
        (["--http-client", "curl"], "--http-client"),
        (["--read-batch-ms", "5"], "--read-batch-ms"),
        (["--sla", "ttft=5"], "ttft"),
        (["--sla", "ttft_ms=fast"], "--sla"),
        (["--sla", "ttft_ms=-5"], "ttft_ms"),
        (["--workload", "no-such-preset"], "no-such-preset"),
        (["--gpus", "0,x"], "--gpus"),
        (["--tokenizer", "/nonexistent/tok.json"], "tokenizer"),
    ],
)
async def test_bad_options_name_the_option_and_send_nothing(server, tmp_path, args, expect):
    srv, seen = server
    base = {"--url": srv.url, "--concurrency": "2", "--requests": "2", "--out": str(tmp_path / "o.json")}
    for i in range(0, len(args), 2):
        base[args[i]] = args[i + 1]
    r = await _bench(*[x for kv in base.items() for x in kv])
    assert r.exit_code == 2, r.output
    first = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
    assert len(first) == 1 and expect in first[0], r.output
    assert seen.calls == []


async def test_unreachable_url_is_a_one_line_error(tmp_path):
    r = await _bench(
        "--url",
        f"http://127.0.0.1:{_closed_port()}",
        "--concurrency",
        "2",
        "--requests",
        "2",
        "--out",
        str(tmp_path / "o.json"),
        "--workload",
        _tiny(tmp_path),
    )
    assert r.exit_code == 2
    assert "unreachable" in r.output and "no request was sent" in r.output
    assert not (tmp_path / "o.json").exists()


async def test_bad_url_scheme(tmp_path):
    r = await _bench(
        "--url", "ftp://x", "--concurrency", "2", "--requests", "2", "--out", str(tmp_path / "o.json")
    )
    assert r.exit_code == 2 and "--url" in r.output


@pytest.fixture
def sim_url(tmp_path_factory):
    """`servetune sim serve` in its own process: simulated SGLang (/server_info, /flush_cache, /metrics)."""
    with sim_server(tmp_path_factory.mktemp("sim"), "--load-seconds", "0", "--enable-metrics",
                    "--enable-cache-report") as server:
        yield server.url


async def test_bench_against_the_simulated_sglang_server(sim_url, tmp_path):
    wl = tmp_path / "sp.yaml"
    wl.write_text(
        "name: sp\ninput: {kind: uniform, min: 300, max: 600}\noutput: {kind: fixed, value: 16}\n"
        "shared_prefix: {tokens: 256}\n"
    )
    out = tmp_path / "sim.json"
    r = await _bench(
        "--url", sim_url, "--concurrency", "8", "--requests", "32", "--warmup", "4", "--out", str(out),
        "--workload", str(wl), "--endpoint", "generate",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    d = orjson.loads(out.read_bytes())
    s = d["summary"]
    assert d["server"]["flush_cache"]["flushed"] is True
    assert d["environment"]["engine"] == "sglang" and d["environment"]["server_args"]
    assert s["token_count_sources"] == {"meta_info": 32}
    assert s["output_len"]["min"] == s["output_len"]["max"] == 16
    # client-side (usage) and server-side (counter deltas, warm-up included) hit rates agree
    assert 0.2 < s["prefix_hit_rate"] < 1 and abs(s["prefix_hit_rate"] - s["prefix_hit_rate_server"]) < 0.1
    assert s["server_samples"] >= 2 and s["server_running_reqs_mean"] is not None
    # the sim's modelled GPUs give a memory curve at the sampler's cadence, marked simulated
    assert s["gpu_state"] == "simulated" and d["gpu"]["state"] == "simulated"
    assert s["gpu_samples"] >= 3 and 0 < s["gpu_mem_peak_fraction"] < 1
    gaps = [b["t_s"] - a["t_s"] for a, b in zip(d["gpu"]["samples"], d["gpu"]["samples"][1:], strict=False)]
    assert sorted(gaps)[len(gaps) // 2] == pytest.approx(0.1, abs=0.03)


async def test_bench_validity_against_the_simulated_server(sim_url, tmp_path):
    """As many streams as requests is a start-up burst: INVALID, and `validate` names the rule;
    enough requests for the window rules make the same kind of trial VALID."""
    wl = tmp_path / "short.yaml"
    wl.write_text("name: short\ninput: {kind: fixed, value: 256}\noutput: {kind: fixed, value: 16}\n")
    burst = tmp_path / "burst.json"
    r = await _bench("--url", sim_url, "--concurrency", "64", "--requests", "64", "--warmup", "0",
                     "--out", str(burst), "--workload", str(wl), "--sla", "ttft_ms=2000")
    assert r.exit_code == 0, r.output
    assert "INVALID" in r.output
    s = orjson.loads(burst.read_bytes())["summary"]
    assert s["valid"] is False and s["window_source"] == "no_steady_window"
    res = CliRunner().invoke(app, ["validate", str(burst)])
    assert res.exit_code == 1 and "steady_window" in res.output and "window_completions" in res.output
    assert "INVALID" in res.output

    steady = tmp_path / "steady.json"
    r = await _bench("--url", sim_url, "--concurrency", "16", "--requests", "400", "--warmup", "16",
                     "--out", str(steady), "--workload", str(wl), "--sla", "ttft_ms=2000",
                     "--min-window-s", "2", "--min-completions", "100")
    assert r.exit_code == 0, r.output
    s = orjson.loads(steady.read_bytes())["summary"]
    assert s["valid"] is True, s["invalid_reasons"]
    assert s["goodput_rps"] <= s["request_throughput"]
    assert abs(s["tokens_per_request"] / s["output_len"]["mean"] - 1) <= 0.05
    assert abs(s["throughput_mismatch"]) <= 0.15
    assert s["in_flight_mean"] >= 0.9 * 16
