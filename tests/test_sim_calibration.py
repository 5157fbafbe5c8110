"""The simulator's H200 calibration against real step times (bench/data/step_times_h200.json).

The fitted profile must reproduce the measurements it was fitted to (median |error| < 15%), a
refit must land on the stored values, and the new eager-engine terms must leave the SGLang
profiles' predictions untouched.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench_modules import bench_module
from servetune.sim import server_args_from_flags
from servetune.sim.cost import CostModel
from servetune.sim.profiles import ProfileError, load_gpu_profile, load_model_profile

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "bench" / "data" / "step_times_h200.json"


def _load_bench():
    return bench_module("calibrate_sim")


cal = _load_bench()


@pytest.fixture(scope="module")
def rows():
    return cal.load_rows(DATA)[1]


def test_stored_profile_reproduces_measurements(rows):
    gpu = load_gpu_profile("H200-transformers-eager")
    s = cal.summary(gpu, rows)
    assert s["rows"] == 34
    assert s["all"] < 15, s
    assert s["prefill"] < 15 and s["decode"] < 15, s
    assert s["1b"] < 15 and s["8b"] < 15, s


def test_refit_lands_on_stored_values(rows):
    base = load_gpu_profile("H200")
    fitted = cal.rounded(cal.fit(base, rows, "refit"))
    stored = load_gpu_profile("H200-transformers-eager")
    for name in cal.FREE:
        assert getattr(fitted, name) == pytest.approx(getattr(stored, name), rel=0.05), name
    assert cal.summary(fitted, rows)["all"] < 15


def test_holdout_transfers_between_model_sizes(rows):
    """Fit on one shape, predict the other: the per-layer terms must carry over (figures in docs/sim.md)."""
    base = load_gpu_profile("H200")
    for train in ("1b", "8b"):
        g = cal.fit(base, [r for r in rows if r.shape == train], f"fit-{train}")
        assert cal.summary(g, [r for r in rows if r.shape != train])["all"] < 20, train


def test_uncalibrated_sglang_profile_is_far_off_on_eager_decode(rows):
    """The H200 (SGLang) profile misses eager decode by a wide margin: the calibration is what closes it."""
    s = cal.summary(load_gpu_profile("H200"), rows)
    assert s["decode"] > 50


def test_model_profiles_match_measured_shapes():
    measured = {r["shape"]: r["params"] for r in json.loads(DATA.read_text())["rows"]}
    for shape, params in measured.items():
        profile = load_model_profile(cal.SHAPE_PROFILES[shape])
        assert profile.params_billion * 1e9 == pytest.approx(params, rel=1e-3), shape
    small = load_model_profile("llama-1b")
    assert small.cell_bytes() == 8 * 2 * 64 * 16 * 2  # 32 KiB per token


def test_eager_terms_default_to_the_sglang_model():
    h200 = load_gpu_profile("H200")
    assert h200.kv_traffic_factor == 1.0 and h200.launch_ms_per_layer == 0.0
    args = server_args_from_flags({"model_profile": "llama-3.1-8b", "gpu_profile": "H200"})
    a, b = CostModel.from_args(args), CostModel.from_profiles(args.model, args.gpu, args.tp_size)
    assert a == b
    # a decode step priced by hand: weights + KV at 80% of 4.8 TB/s, plus 1.4 ms
    m = load_model_profile("llama-3.1-8b")
    expect = (m.weight_bytes + m.cell_bytes() * (64 * 1024 + 64)) / (4800e9 * 0.8) + 1.4e-3
    assert a.decode_s(64, 64 * 1024) == pytest.approx(expect, rel=1e-9)


def test_eager_terms_change_the_price():
    m = load_model_profile("llama-3.1-8b")
    h200 = load_gpu_profile("H200")
    plain = CostModel.from_profiles(m, h200)
    floor = CostModel.from_profiles(m, h200.model_copy(update={"launch_ms_per_layer": 0.5}))
    assert floor.decode_s(1, 1) == pytest.approx(32 * 0.5e-3)  # launch-bound: 32 layers x 0.5 ms
    assert floor.extend_s(8192, 8192 * 8193 / 2, 0, 1) == plain.extend_s(8192, 8192 * 8193 / 2, 0, 1)  # GPU-bound
    kv = CostModel.from_profiles(m, h200.model_copy(update={"kv_traffic_factor": 3.0}))
    extra = kv.decode_s(64, 64 * 4096) - plain.decode_s(64, 64 * 4096)
    assert extra == pytest.approx(2 * m.cell_bytes() * (64 * 4096 + 64) / h200.bytes_per_s, rel=1e-9)


def test_bad_input_is_named(tmp_path):
    doc = json.loads(DATA.read_text())
    del doc["rows"][3]["ms_median"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"rows\[3\] has no 'ms_median'"):
        cal.load_rows(bad)
    prof = tmp_path / "gpu.yaml"
    prof.write_text((ROOT / "servetune/sim/profiles/gpu/H200-transformers-eager.yaml").read_text()
                    .replace("kv_traffic_factor: 8.41", "kv_traffic_factor: 0.5"))
    with pytest.raises(ProfileError, match="kv_traffic_factor"):
        load_gpu_profile(str(prof))


def test_errors_are_signed_percentages(rows):
    gpu = load_gpu_profile("H200-transformers-eager")
    errs = cal.errors_pct(gpu, rows)
    r = rows[0]
    assert errs[0] == pytest.approx((cal.predict_ms(gpu, r) / r.ms - 1) * 100)
    assert np.any(errs > 0) and np.any(errs < 0)
