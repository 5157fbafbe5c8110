"""The simulator calibrated against real SGLang 0.5.17 on an H200 (docs/sim.md, Calibration).

Step times come from SGLang's own scheduler log kept with tune-b's trials
(servetune.sim.sglang_steps); the fitted profile H200-sglang must price them and tune-c's (never
fitted on) closely, a refit must land on the stored values, and replaying held-out tune-c trials in
virtual time must come within the 10% target on throughput and TPOT and beat the unfitted H200
profile. The figures in the docs come from bench/calibrate_sim.py and bench/sim_vs_sglang.py.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from bench_modules import bench_module
from servetune.sim.profiles import load_gpu_profile, load_model_profile
from servetune.sim.sglang_steps import load_trials, step_rows

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "gpu-h200-sglang"
TUNE_B, TUNE_C = DATA / "tune-b.tar.xz", DATA / "tune-c.tar.xz"


cal = bench_module("calibrate_sim")
svs = bench_module("sim_vs_sglang")


@pytest.fixture(scope="module")
def tune_b() -> list[dict]:
    return load_trials([TUNE_B])


@pytest.fixture(scope="module")
def rows_b():
    return cal.load_sglang_rows([TUNE_B])[1]


def test_a_real_trials_log_gives_plausible_steps(tune_b) -> None:
    """Decode steps of one trial at each level: a few ms, growing with the batch; prefill ~40 tokens/ms."""
    by_level = {}
    for t in tune_b:
        if t["stage"] in ("baseline", "ramp") and t["load"]["concurrency"] not in by_level:
            by_level[t["load"]["concurrency"]] = step_rows(t)
    assert sorted(by_level) == [8, 32, 64, 128]
    decode_ms = {}
    for level, rows in by_level.items():
        dec = [r for r in rows if r["phase"] == "decode" and r["batch"] == level]
        assert len(dec) >= 5, level
        assert all(400 < r["context"] < 1600 for r in dec)  # prompts median 768 + up to 128 generated
        decode_ms[level] = statistics.median(r["ms"] for r in dec)
    assert 4 < decode_ms[8] < decode_ms[32] < decode_ms[64] < decode_ms[128] < 15, decode_ms
    big = [r for rows in by_level.values() for r in rows
           if r["phase"] == "prefill" and r["batch"] * r["context"] >= 4096]
    rate = statistics.median(r["batch"] * r["context"] / r["ms"] for r in big)
    assert 30 < rate < 50, rate  # new tokens per ms of a large prefill batch of the 7.24B model
    assert all(0 <= r["cached"] <= 300 for r in big)  # a shared prefix of 256 template tokens


def test_only_clean_intervals_become_rows() -> None:
    """A decode line after a prefill, or after a request finished, measures something else: left out."""
    def dec(b, tok, rate):
        return {"kind": "decode", "running_req": b, "num_token": tok, "throughput": rate}

    def pre(seqs, new, cached, rate, queue):
        return {"kind": "prefill", "new_seq": seqs, "new_token": new, "cached_token": cached,
                "throughput": rate, "queue_req": queue, "pending_token": 0}

    log = [dec(8, 8000, 1000.0), dec(8, 8320, 1600.0),   # 40 steps of 8: kept, 5 ms
           pre(1, 500, 0, 500.0, 0),                       # after a decode: the gap is not its forward
           pre(2, 1000, 264, 25000.0, 3),                  # still first in its burst: left out
           pre(4, 4000, 528, 40000.0, 0),                  # the previous one left 3 waiting: kept, 100 ms
           dec(10, 9000, 1200.0),                          # after a prefill: left out
           dec(9, 9360, 1500.0),                           # a request finished meanwhile: left out
           dec(9, 9720, 1500.0)]                           # kept, 6 ms
    trial = {"trial_id": "t", "load": {"concurrency": 10}, "server": {"scheduler_log": {"rows": log}},
             "summary": {"cached_len": {"mean": 0.0, "p90": 0.0}}}
    rows = step_rows(trial)
    assert [(r["phase"], r["batch"]) for r in rows] == [("decode", 8), ("prefill", 4), ("decode", 9)]
    assert [round(r["ms"], 6) for r in rows] == [5.0, 100.0, 6.0]
    assert rows[0]["context"] == pytest.approx(8160 / 8) and rows[1]["cached"] == 132


def test_shared_prefix_copies_are_added_back() -> None:
    """#token counts a shared prefix once; each sequence attends to its own copy."""
    log = [{"kind": "decode", "running_req": 64, "num_token": 50000 + i * 2560, "throughput": 8000.0} for i in range(2)]
    trial = {"server": {"scheduler_log": {"rows": log}}, "load": {"concurrency": 64},
             "workload": {"spec": {"shared_prefix": {"num_prefixes": 4}}},
             "summary": {"cached_len": {"mean": 200.0, "p90": 264.0}}}
    (row,) = step_rows(trial)
    assert row["context"] == pytest.approx((51280 + 64 * 200 - 4 * 264) / 64)


def test_the_fitted_profile_loads_and_says_what_it_models() -> None:
    gpu = load_gpu_profile("H200-sglang")
    assert gpu.launch_ms_per_layer == 0.0 and gpu.kv_traffic_factor >= 1.0
    assert gpu.peak_bf16_tflops == load_gpu_profile("H200").peak_bf16_tflops
    header = (ROOT / "servetune/sim/profiles/gpu/H200-sglang.yaml").read_text().split("\nname:")[0]
    for words in ("sglang 0.5.17", "NVIDIA H200", "triton attention", "CUDA graphs", "tune-b.tar.xz",
                  "bench/calibrate_sim.py --base H200 --name H200-sglang --from-sglang-trials"):
        assert words in header, words
    model = load_model_profile("llama-8b-v32k")
    assert model.params_billion == pytest.approx(7.2417, abs=1e-4) and model.vocab_size == 32000
    assert model.cell_bytes() == load_model_profile("llama-3.1-8b").cell_bytes()


def test_refit_on_tune_b_lands_on_the_stored_values(rows_b) -> None:
    base = load_gpu_profile("H200")
    fitted = cal.rounded(cal.fit(base, rows_b, "refit", cal.SGLANG_FREE, cal.bin_weights(rows_b), "soft_l1"),
                         cal.SGLANG_FREE)
    stored = load_gpu_profile("H200-sglang")
    for name in cal.SGLANG_FREE:
        assert getattr(fitted, name) == pytest.approx(getattr(stored, name), rel=0.05), name


def test_held_out_step_times_are_priced_closely(rows_b) -> None:
    """tune-c's logged steps (another engine process, never fitted on): within a few % per phase."""
    rows_c = cal.load_sglang_rows([TUNE_C])[1]
    fitted, base = load_gpu_profile("H200-sglang"), load_gpu_profile("H200")
    s, sb = cal.summary(fitted, rows_c, by="bin"), cal.summary(base, rows_c, by="bin")
    assert s["rows"] > 500
    assert s["decode"] < 3 and s["prefill"] < 6, s  # measured 1.1% and 3.3%
    assert s["decode"] < sb["decode"] and s["prefill"] < sb["prefill"] and s["all"] < sb["all"]
    assert cal.summary(fitted, rows_b, by="bin")["all"] < 4


def test_held_out_trials_replay_within_the_target() -> None:
    """Six tune-c trials (every level, each refinement flag) replayed with their flags in virtual time:
    median |error| <= 10% on output tok/s and TPOT p50 with H200-sglang, and better than H200 on TPOT
    and TTFT (docs/sim.md has all 32 held-out trials)."""
    trials, invalid = svs.real_trials(["tune-c"])
    assert invalid == {"tune-c": 3} and len(trials) == 14
    pick = {"57e1171d", "a39eed09", "df757cc1", "15eb36f4", "7b57ed0d", "af448dfd", "802c1794"}
    subset = [t for t in trials if t["source"].split()[1] in pick]
    assert {t["level"] for t in subset} == {8, 32, 64, 128}
    assert {k for t in subset for k in t["flags"]} >= {"chunked-prefill-size", "schedule-conservativeness",
                                                       "max-running-requests"}
    rows = svs.compare(subset, ["H200-sglang", "H200"], "llama-8b-v32k")
    med = {g: {n: svs.median_abs(rows, g, n) for n, _ in svs.FIGURES} for g in ("H200-sglang", "H200")}
    fit, unfit = med["H200-sglang"], med["H200"]
    assert fit["output tok/s"] <= 0.10 and fit["TPOT p50 ms"] <= 0.10, med
    assert fit["TPOT p50 ms"] < unfit["TPOT p50 ms"] and fit["TTFT p50 ms"] < unfit["TTFT p50 ms"], med


def test_open_loop_trials_replay_under_their_own_arrivals() -> None:
    """The three real open-loop trials (Poisson 8/16/24 req/s) replayed in virtual time with their own
    load (rate mode, seed, cap): the simulator keeps the offered rate and TPOT p50 within 10%, and with the
    profile's front-end latency (fitted on these three, docs/sim.md) TTFT p50 within 15% (without it: 15-24 ms
    short, -42 to -48%)."""
    trials, invalid = svs.real_trials(["openloop"])
    assert invalid == {"openloop": 0} and sorted(t["load"]["rate"] for t in trials) == [8.0, 16.0, 24.0]
    assert all(t["load"]["mode"] == "rate" and t["load"]["arrival"] == "poisson" for t in trials)
    rows = svs.compare(trials, ["H200-sglang"], "llama-8b-v32k")
    for r in rows:
        err = r["err"]["H200-sglang"]
        assert abs(err["output tok/s"]) < 0.02 and abs(err["TPOT p50 ms"]) < 0.10, err
        assert abs(err["TTFT p50 ms"]) < 0.15, err  # -10% to +11% with the 19.3 ms front end
