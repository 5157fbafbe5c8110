"""Results measured on a real NVIDIA H200 (issue 9), kept as test data: they load into the warehouse,
carry a real NVML memory curve, and the checklist's verdicts on them are the honest ones.

tests/data/gpu-h200/: `servetune bench` at concurrency 32 and a staged `servetune tune` (correctness ->
baseline -> ramp -> ceiling) against `transformers serve` (continuous batching, CUDA graphs) serving a
random 1B-shaped Llama, both started by servetune's local runner (scripts/gpu-h200-campaign.sh).
"""

from __future__ import annotations

from pathlib import Path

import orjson
from sqlalchemy import create_engine, text

from servetune.ingest import load_result
from servetune.result import TrialResult
from servetune.validation import validate
from servetune.warehouse import migrate

DATA = Path(__file__).parent / "data" / "gpu-h200"


def test_bench_on_h200_has_a_real_nvml_curve_and_exact_lengths():
    r = TrialResult.read(DATA / "bench-c32.json")
    s = r.summary
    assert r.status == "ok" and s.requests_measured == 200 and s.requests_failed == 0
    assert r.gpu["state"] == "ok" and "H200" in r.gpu["devices"][0]["name"]
    # ~100 ms cadence over the whole trial, memory well above idle while serving
    ts = [x["t_s"] for x in r.gpu["samples"]]
    gaps = sorted(b - a for a, b in zip(ts, ts[1:], strict=False))
    assert 0.09 < gaps[len(gaps) // 2] < 0.11 and s.gpu_samples > 100
    assert s.gpu_mem_peak_bytes > 20 * 2**30 and 0 < s.gpu_mem_peak_fraction < 0.9
    assert s.lengths_exact and s.output_len.min == s.output_len.max == 128
    assert s.ttft_ms.p99 < s.e2e_ms.p50 and s.output_tokens_per_s > 100


def test_h200_campaign_found_a_ceiling_and_loads(fresh_database_url):
    exp = orjson.loads((DATA / "campaign" / "experiment.json").read_bytes())
    rec = orjson.loads((DATA / "campaign" / "recommendation.json").read_bytes())
    assert exp["status"] == "done" and exp["ceiling"]["kind"] == "plateau"
    assert rec["concurrency"] == exp["ceiling"]["concurrency"]
    trials = [TrialResult.read(p) for p in (DATA / "campaign" / "trials").glob("*.json")]
    assert {t.stage for t in trials} == {"correctness", "baseline", "ramp"}
    assert all(t.gpu["state"] == "ok" and t.summary.gpu_samples > 10 for t in trials)

    # transformers serve reports no cached tokens: the checklist rejects on the missing hit rate,
    # and says so, rather than the result passing without it
    report = validate(next(t for t in trials if t.stage == "baseline"), min_measured=160)
    assert not report.success
    assert "prefix_hit_rate" in {o.checklist for o in report.failed}

    migrate.upgrade(fresh_database_url)
    loaded = load_result(fresh_database_url, DATA / "campaign", min_measured=160)
    assert not loaded.errors and len(loaded.trials) == len(trials)
    eng = create_engine(fresh_database_url)
    try:
        with eng.connect() as conn:
            n_gpu = conn.execute(text("select count(*) from gpu_samples")).scalar_one()
            statuses = set(conn.execute(text("select status from trials")).scalars())
    finally:
        eng.dispose()
    assert n_gpu == sum(len(t.gpu["samples"]) for t in trials)
    assert statuses == {"rejected"}
