"""SGLang's scheduler batch lines: parsed from a real SGLang 0.5.17 log (an H200 run), printed by the
simulated server in the same format, and kept with a trial when servetune started the engine."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from servetune.engines import parse_engine_config
from servetune.loadgen import LoadConfig, Target
from servetune.runners import LocalRunnerConfig, provision
from servetune.telemetry.scheduler_log import LogTail, capture, parse, parse_line, signals
from servetune.trial import TrialRequest, run_trial
from servetune.workload.spec import WorkloadSpec

REAL_LOG = Path(__file__).parent / "data" / "gpu-h200-sglang" / "sglang-0.5.17-scheduler.log"


def test_a_real_sglang_log_parses() -> None:
    rows, unparsed = parse(REAL_LOG.read_text().splitlines())
    prefill = [r for r in rows if r["kind"] == "prefill"]
    decode = [r for r in rows if r["kind"] == "decode"]
    assert len(decode) == 67 and len(prefill) == len(rows) - 67 and unparsed == 0
    p = prefill[0]  # "#new-seq: 1, #new-token: 7, #cached-token: 0, ..., cuda graph: True, input throughput ..: 0.90"
    assert (p["new_seq"], p["new_token"], p["cached_token"], p["cuda_graph"], p["throughput"]) == (1, 7, 0, True, 0.9)
    assert all(r["running_req"] is not None and r["token_usage"] is not None for r in rows[:-1])
    busy = max(decode[:-1], key=lambda r: r["running_req"])
    assert busy["running_req"] >= 60 and busy["num_token"] > 10_000 and busy["throughput"] > 1000
    assert decode[-1]["running_req"] is None  # "#running-req: oops": the field is unknown, not a crash
    s = signals({"rows": rows})
    assert s["sched_prefill_batches"] == len(prefill) and 0 < s["sched_cache_hit_rate"] < 1
    assert s["sched_cuda_graph_fraction"] == 1.0 and s["sched_queue_max"] > 0


def test_other_lines_are_not_batches() -> None:
    assert parse_line("[2026-12-01 09:22:08] The server is fired up and ready to roll!") is None
    assert parse_line("Decode batch, #running-req: 3") is None  # no timestamp: not a scheduler line


def test_capture_keeps_only_the_trials_span(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text(REAL_LOG.read_text())
    tail = LogTail(log)
    assert capture(tail, 0.0, 1e12) == {"parser": "sglang-scheduler-log", "source": "engine.log", "rows": [],
                                        "unparsed_lines": 0, "resolution_s": 1.0}  # nothing new since the start
    lines = REAL_LOG.read_text().splitlines()
    with log.open("a") as fh:
        fh.write("\n".join(lines[-20:]) + "\n")
    rows, _ = parse(lines[-20:])
    t0 = rows[0]["t_unix"]
    got = capture(tail, t0, t0 + 3600)
    assert got is not None and len(got["rows"]) == len(rows) and got["rows"][0]["t_s"] == 0.0


@pytest.mark.timeout(180)
def test_the_simulated_server_logs_batches_and_a_trial_keeps_them(tmp_path: Path) -> None:
    engine = parse_engine_config({"kind": "sim", "model_profile": "llama-3.1-8b", "gpu_profile": "A100-80G",
                                  "load_seconds": 0.1})
    work = WorkloadSpec.model_validate({"name": "log", "seed": 3, "input": {"kind": "uniform", "min": 200, "max": 600},
                                        "output": {"kind": "fixed", "value": 48},
                                        "shared_prefix": {"tokens": 128, "share_ratio": 1.0}})
    with provision(engine, LocalRunnerConfig(), log_dir=tmp_path) as server:
        req = TrialRequest(target=Target(url=server.url, endpoint="generate"), workload=work,
                           load=LoadConfig(concurrency=8, warmup_requests=8), num_requests=120,
                           server_log=str(server.log_path), scrape_interval_s=0.5)
        result = asyncio.run(asyncio.to_thread(run_trial, req))
    log = result.server["scheduler_log"]
    kinds = {r["kind"] for r in log["rows"]}
    assert kinds == {"prefill", "decode"} and log["unparsed_lines"] == 0
    s = result.summary
    assert s.sched_prefill_batches >= 10 and s.sched_decode_lines >= 1
    assert s.sched_decode_running_mean is not None and 1 <= s.sched_decode_running_mean <= 8
    # the scheduler's cache view agrees with the client's usage counts
    assert s.sched_cache_hit_rate == pytest.approx(s.prefix_hit_rate, abs=0.1)
